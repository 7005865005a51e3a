"""What ``--resume`` may change: fields marked ``resume=True`` (:func:`~horizonrl.config.fields.opt`) are
the only ones that may differ from the saved config (:func:`resume_conflicts`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from horizonrl.config.run import SECTIONS, RunConfig


def resumable_fields() -> list[str]:
    """Fields ``--resume`` may change: the run length and output-only settings (``opt(resume=True)``)."""
    return [
        f"{s}.{f.name}"
        for s, cls in SECTIONS.items()
        for f in dataclasses.fields(cls)
        if f.metadata["resume"]
    ]


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET = _Unset()


def _leaves(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{prefix}.{k}"))
        return out
    return {prefix: value}


def resume_conflicts(saved: RunConfig, new: RunConfig) -> list[str]:
    """``field: saved -> new`` for every field that differs and may not change on resume.

    Mapping fields (``env.knobs``, ``*_params``) are compared key by key; a key present on
    one side only shows as ``<unset>`` on the other.
    """
    allowed = {*resumable_fields(), "train.out_dir"}  # the run directory resumed is the one named
    lines = []
    a, b = saved.to_dict(), new.to_dict()
    for sec in SECTIONS:
        for name in a[sec]:
            if f"{sec}.{name}" in allowed or a[sec][name] == b[sec][name]:
                continue
            la, lb = _leaves(a[sec][name], f"{sec}.{name}"), _leaves(b[sec][name], f"{sec}.{name}")
            for key in sorted(set(la) | set(lb)):
                va, vb = la.get(key, _UNSET), lb.get(key, _UNSET)
                if va != vb:
                    lines.append(f"{key}: {va!r} -> {vb!r}")
    return lines
