"""Loading a :class:`~horizonrl.config.run.RunConfig` from YAML and overrides, saving it, the reference.

Configs load from YAML (:func:`horizonrl.safe_yaml.load_yaml`: JSON-like values only, no tags, bounded
alias expansion) and accept ``section.field=value`` overrides on the command line (values parsed the
same way); unknown sections and fields are refused. :func:`describe` renders every field with its
default and help as the Markdown table README.md embeds.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import yaml

from horizonrl.config.fields import MAX_CONFIG_BYTES
from horizonrl.config.run import MOVED_SECTIONS, SECTIONS, RunConfig
from horizonrl.errors import ConfigError, HorizonWarning
from horizonrl.safe_yaml import load_yaml


def from_dict(d: dict[str, Any] | None) -> RunConfig:
    """Build a validated :class:`RunConfig`; unknown sections or fields raise ConfigError."""
    d = d or {}
    if not isinstance(d, dict):
        raise ConfigError(f"config must be a mapping of sections, got {type(d).__name__}")
    d = _moved_sections(d)
    sections = {}
    for name, value in d.items():
        if name not in SECTIONS:
            raise ConfigError(f"unknown config section {name!r}; known: {sorted(SECTIONS)}")
        cls = SECTIONS[name]
        value = value or {}
        if not isinstance(value, dict):
            raise ConfigError(f"config section {name!r} must be a mapping, got {value!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        for k in value:
            if k not in known:
                raise ConfigError(f"unknown config field {name}.{k}; known: {sorted(known)}")
        sections[name] = cls(**value)
    return RunConfig(**sections)


def _moved_sections(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` with each section of :data:`MOVED_SECTIONS` merged into its new place (values given there
    win; the old section's defaults dropped), and a :class:`~horizonrl.errors.HorizonWarning` naming
    the move when anything was carried."""
    for old, (new, defaults) in MOVED_SECTIONS.items():
        if old not in d:
            continue
        value = d[old] or {}
        if not isinstance(value, dict):
            raise ConfigError(f"config section {old!r} must be a mapping, got {value!r}")
        value = {k: v for k, v in value.items() if k not in defaults or v != defaults[k]}
        d = {k: v for k, v in d.items() if k != old}
        if not value:
            continue
        warnings.warn(
            f"config section {old!r} is now {new} ({old}.FIELD -> {new}.FIELD); reading it from there",
            HorizonWarning,
            stacklevel=3,
        )
        section, key = new.split(".")
        target = dict(d.get(section) or {})
        target[key] = {**value, **(target.get(key) or {})}
        d[section] = target
    return d


def apply_overrides(d: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.field=value`` overrides (value parsed as YAML) to a config dict."""
    if not isinstance(d or {}, dict):
        raise ConfigError(f"config must be a mapping of sections, got {type(d).__name__}")
    out: dict[str, Any] = {}
    for k, v in (d or {}).items():
        if v is not None and not isinstance(v, dict):
            raise ConfigError(f"config section {k!r} must be a mapping, got {v!r}")
        out[k] = dict(v or {})
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form section.field=value")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        if len(parts) < 2 or not all(parts):
            raise ConfigError(f"override key {key!r} must be section.field")
        value = load_yaml(raw, source=f"override {item!r}") if raw.strip() else None
        target = out.setdefault(parts[0], {})
        for i, p in enumerate(parts[1:-1], 1):
            target = target.setdefault(p, {})
            if not isinstance(target, dict):
                raise ConfigError(f"override {item!r}: {'.'.join(parts[: i + 1])} is not a mapping")
        target[parts[-1]] = value
    return out


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML config file; ConfigError for anything that is not one."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {path} does not exist")
    if not p.is_file():
        raise ConfigError(f"config file {path} is not a regular file (a directory?)")
    if p.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is {p.stat().st_size} bytes; at most {MAX_CONFIG_BYTES}")
    data = p.read_bytes()
    if b"\x00" in data:
        raise ConfigError(f"config file {path} is a binary file, not YAML")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (invalid byte at offset {e.start})"
        ) from None
    raw = load_yaml(text, source=f"config file {path}")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(
            f"config file {path} must be a mapping of sections (model:, env:, ...), got {type(raw).__name__}"
        )
    for name, section in raw.items():
        if section is not None and not isinstance(section, dict):
            raise ConfigError(f"config file {path}: section {name!r} must be a mapping, got {section!r:.80}")
    return raw


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    raw = read_config_file(path) if path is not None else {}
    return from_dict(apply_overrides(raw, overrides or []))


def save_config(cfg: RunConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def describe() -> str:
    """Markdown table of every field with its default and help (the config reference)."""
    lines = ["| field | default | help |", "|---|---|---|"]
    for sec, cls in SECTIONS.items():
        lines += field_rows(cls, f"{sec}.")
    return "\n".join(lines)


def field_rows(cls: type, prefix: str) -> list[str]:
    """One Markdown table row per field of the dataclass ``cls``: name, default, help, resume note."""
    rows = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        note = " *(may change on `--resume`)*" if f.metadata.get("resume") else ""
        rows.append(f"| `{prefix}{f.name}` | `{default!r}` | {f.metadata.get('help', '')}{note} |")
    return rows
