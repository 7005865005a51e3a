"""horizonrl.benchtools writes a benchmark's printed output into the docs block it names and nothing
else; benchmarks/smollm2_rollout.py's settings each add one change to the row above."""

from __future__ import annotations

import itertools

import pytest

from helpers.script_loader import load_script
from horizonrl import benchtools


def _bench():
    return load_script("benchmarks/smollm2_rollout.py")


def _docs():
    return benchtools


def test_write_block_replaces_only_the_block(tmp_path):
    doc = tmp_path / "models.md"
    doc.write_text("before\n<!-- smollm2-rollout -->\nold table\n<!-- /smollm2-rollout -->\nafter\n")
    _docs().write_block(
        doc, "smollm2-rollout", ["replay: 1 call", "  fp32  10 tok/s"], "python bench.py --docs x"
    )
    assert doc.read_text() == (
        "before\n<!-- smollm2-rollout -->\n`python bench.py --docs x`:\n\n```\nreplay: 1 call\n"
        "  fp32  10 tok/s\n```\n<!-- /smollm2-rollout -->\nafter\n"
    )


def test_write_block_without_the_block_says_so(tmp_path):
    doc = tmp_path / "models.md"
    doc.write_text("no block here\n")
    with pytest.raises(SystemExit, match=r"no <!-- smollm2-rollout --> .* block"):
        _docs().write_block(doc, "smollm2-rollout", ["x"], "cmd")
    assert doc.read_text() == "no block here\n"
    doc.write_text("<!-- /smollm2-rollout -->\n<!-- smollm2-rollout -->\n")  # the end before the start
    with pytest.raises(SystemExit, match="block to replace"):
        _docs().write_block(doc, "smollm2-rollout", ["x"], "cmd")


def test_printed_keeps_every_line_it_prints(capsys):
    emit = _docs().Printed()
    emit("row one")
    emit("\nrow two\nrow three")
    assert emit.lines == ["row one", "", "row two", "row three"]
    assert capsys.readouterr().out == "row one\n\nrow two\nrow three\n"


def test_every_setting_turns_off_only_known_fixes():
    bench = _bench()
    assert {f for *_, without in bench.SETTINGS for f in without} <= set(bench.FIXES)
    # Each row adds one change to the row before it: the fixes turned off only shrink down the table.
    offs = [set(without) for *_, without in bench.SETTINGS]
    assert all(later <= earlier for earlier, later in itertools.pairwise(offs))
