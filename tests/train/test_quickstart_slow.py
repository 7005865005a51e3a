"""The README's quickstart promise (slow: about 8 minutes on 2 CPU cores; `make test-slow`)."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_quickstart_raises_held_out_success_by_15_points(tmp_path):
    from horizonrl.train.recipes import quickstart

    result = quickstart(out_dir=tmp_path / "qs")
    before, after = result["before"]["eval/pass@1"], result["after"]["eval/pass@1"]
    assert after - before >= 0.15, (before, after)
    assert result["seconds"] < 15 * 60
