"""The validation mini-framework every config section is built on, and the limits the sections share.

:func:`opt` declares a dataclass field with its help string and simple checks (``choices``, ``ge``,
``gt``, ``le``, ``resume``); :class:`_Section` runs :func:`_check` on every field when a section is
built, so an error names the field and the bad value (floats must be finite: NaN and infinity never
pass a range check; sizes that allocate memory have upper bounds). Checks that look at more than one
field of a section live in that section's ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import field
from typing import Any

from horizonrl.errors import ConfigError

#: Experiment loggers ``train.loggers`` may name (``horizonrl.train.records.loggers`` registers each; a test
#: keeps the two equal).
LOGGERS = ("jsonl", "tensorboard", "wandb", "mlflow", "trackio")


#: Seeds are in ``[0, MAX_SEED]`` (every RNG the run seeds accepts them).
MAX_SEED = 2**32 - 1
#: Largest config file read.
MAX_CONFIG_BYTES = 1 << 20
_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def opt(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    choices=None,
    ge=None,
    gt=None,
    le=None,
    resume: bool = False,
    **kw,
):
    """A dataclass field with a help string and simple declarative checks.

    ``resume=True``: the field may differ from the saved config when a run is resumed
    (run length and output-only settings; see :func:`resume_conflicts`).
    """
    meta = {"help": help, "choices": choices, "ge": ge, "gt": gt, "le": le, "resume": resume}
    if isinstance(default, dict | list):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


def _check(obj: Any, prefix: str) -> None:
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        name = f"{prefix}{f.name}"
        hint = hints[f.name]
        if dataclasses.is_dataclass(v):
            continue
        origin = typing.get_origin(hint)
        allowed = typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)
        if v is None and type(None) in allowed:
            continue
        base = tuple(typing.get_origin(a) or a for a in allowed if a is not type(None))
        if float in base and isinstance(v, int | str) and not isinstance(v, bool):
            # YAML reads `3e-4` (no dot) as a string; accept any float literal.
            try:
                v = float(v)
            except ValueError:
                pass
            else:
                object.__setattr__(obj, f.name, v)
        if (base and not isinstance(v, base)) or (isinstance(v, bool) and bool not in base):
            raise ConfigError(f"{name}={v!r}: expected {' or '.join(b.__name__ for b in base)}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{name}={v!r}: must be a finite number")
        m = f.metadata
        if m.get("choices") is not None and v not in m["choices"]:
            raise ConfigError(f"{name}={v!r}: must be one of {list(m['choices'])}")
        if m.get("ge") is not None and v < m["ge"]:
            raise ConfigError(f"{name}={v!r}: must be >= {m['ge']}")
        if m.get("gt") is not None and not v > m["gt"]:
            raise ConfigError(f"{name}={v!r}: must be > {m['gt']}")
        if m.get("le") is not None and v > m["le"]:
            raise ConfigError(f"{name}={v!r}: must be <= {m['le']}")


class _Section:
    _prefix = ""

    def __post_init__(self) -> None:
        _check(self, self._prefix)
