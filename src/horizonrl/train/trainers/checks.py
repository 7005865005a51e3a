"""Checks of a run config against the registries, before anything is built.

:func:`check_run` runs at the start of every trainer, ``horizonrl sft`` and
``horizonrl eval``: each registered name (trainer, estimator, agent, context
manager, environment, engine) must exist, each ``*_params`` mapping must fit
what it configures (names, and the types of scalar parameters from their
annotations or defaults): an estimator's declared parameters
(:meth:`~horizonrl.credit.EstimatorSpec.settable`, its params dataclass), the
signature of an agent, context manager or engine. The environment's knobs must
pass its own ``validate_knobs``, and the device must exist. Every failure is a
:class:`~horizonrl.config.ConfigError` naming the field and value, raised
before a model is loaded or a directory written.
"""

from __future__ import annotations

import inspect
import types
import typing
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from horizonrl.config import ConfigError, RunConfig, load_config, resumable_fields, resume_conflicts
from horizonrl.errors import HorizonWarning
from horizonrl.jsonl import check_type
from horizonrl.vocab import ThinkingHistory

_SCALARS = (bool, int, float, str)


def _scalar_types(hint: Any, default: Any) -> tuple[tuple[type, ...], bool] | None:
    """``(types, none_ok)`` a parameter accepts, or None when it is not a plain scalar."""
    if hint is None:
        if default is inspect.Parameter.empty or default is None or type(default) not in _SCALARS:
            return None
        return (type(default),), False
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    none_ok = type(None) in args
    rest = tuple(a for a in args if a is not type(None))
    if not rest or not all(a in _SCALARS for a in rest):
        return None
    return rest, none_ok


def check_kwargs(
    fn: Callable, params: dict[str, Any], *, field: str, owner: str, skip: Iterable[str] = ()
) -> None:
    """ConfigError unless ``fn`` accepts every key of ``params`` with a value of the annotated type.

    ``skip``: parameters that are not the user's to set (positional inputs, trainer-computed ones).
    """
    if not isinstance(params, dict):
        raise ConfigError(f"{field}={params!r}: expected a mapping")
    sig = inspect.signature(fn)
    skip = set(skip)
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    accepted = {n: p for n, p in sig.parameters.items() if p.kind in kinds and n not in skip}
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # annotations that do not resolve at run time: check by the defaults only
        hints = {}
    any_name = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    declared = {n: (hints.get(n), p.default) for n, p in accepted.items()}
    check_params(declared, params, field=field, owner=owner, any_name=any_name)


def check_params(
    declared: dict[str, tuple[Any, Any]],
    params: dict[str, Any],
    *,
    field: str,
    owner: str,
    any_name: bool = False,
) -> None:
    """ConfigError unless every key of ``params`` is ``declared`` (name -> ``(type hint, default)``, as
    :meth:`~horizonrl.credit.EstimatorSpec.settable` gives) with a value of its type.

    ``any_name``: other names pass too (a function taking ``**kwargs``); a declared hint that is not a
    plain scalar (or one with None) is not checked; without a hint the default's type is.
    """
    if not isinstance(params, dict):
        raise ConfigError(f"{field}={params!r}: expected a mapping")
    if not any_name:
        unknown = sorted(str(k) for k in set(params) - set(declared))
        if unknown:
            raise ConfigError(
                f"{field}: unknown parameter(s) {unknown} of {owner}; accepted: {sorted(declared) or 'none'}"
            )
    for name, value in params.items():
        if name not in declared:
            continue
        hint, default = declared[name]
        expected = _scalar_types(hint, default)
        if expected is None or (value is None and (expected[1] or default is None)):
            continue
        why = check_type(value, expected[0])
        if why is not None:
            raise ConfigError(f"{field}.{name}={value!r}: {why} ({owner})")


def check_names(cfg: RunConfig, *, trainer: bool = True) -> None:
    """Every registered name the config uses exists, and its parameters fit (module docstring)."""
    from horizonrl.agents.context import (
        CONTEXTS,
        ContextManager,
        LoopLimits,
        context_params_declaration,
        make_context,
    )
    from horizonrl.agents.registry import AGENTS, FEW_SHOT_AGENTS, agent_params_declaration
    from horizonrl.credit.registry import ESTIMATORS
    from horizonrl.inference.registry import ENGINES, TRAINER_SET, engine_parameters
    from horizonrl.registry import UnknownNameError

    a, r = cfg.algo, cfg.rollout
    if trainer:
        from horizonrl.train.trainers.registry import trainer_params, trainers_with

        trainer_params(cfg)  # the trainer exists and its train.trainer_params fit
        dynamic = trainers_with("samples_dynamically")
        if r.dynamic_sampling and cfg.train.trainer not in dynamic:
            raise ConfigError(
                f"rollout.dynamic_sampling=true: read by train.trainer={'|'.join(dynamic)}, "
                f"not train.trainer={cfg.train.trainer!r}"
            )
        if r.dynamic_sampling and cfg.train.max_staleness > 0:
            raise ConfigError(
                f"rollout.dynamic_sampling=true: not with asynchronous rollouts (train.max_staleness="
                f"{cfg.train.max_staleness}), whose batches are drawn before the step"
            )
    spec = ESTIMATORS.get(a.estimator, field="algo.estimator")
    check_params(
        spec.settable(),
        dict(a.estimator_params),
        field="algo.estimator_params",
        owner=f"estimator {a.estimator!r}",
        any_name=spec.params is None,
    )
    AGENTS.get(r.agent, field="rollout.agent")  # an unknown name: the ConfigError naming the field
    check_kwargs(
        agent_params_declaration(r.agent),
        dict(r.agent_params),
        field="rollout.agent_params",
        owner=f"agent {r.agent!r}",
        skip=("env", "task", "spec", "uid", "group_id"),
    )
    check_kwargs(
        context_params_declaration(CONTEXTS.get(r.context, field="rollout.context")),
        dict(r.context_params),
        field="rollout.context_params",
        owner=f"context manager {r.context!r}",
        skip=("self", "limits"),
    )
    try:  # the managers check their values when built; building one is cheap
        make_context(r.context, LoopLimits(r.max_turns, r.context_budget, r.overflow), dict(r.context_params))
    except ValueError as e:
        raise ConfigError(f"rollout.context_params={dict(r.context_params)!r}: {e}") from None
    if (
        r.thinking_history == ThinkingHistory.DROP
        and CONTEXTS.get(r.context).commit is not ContextManager.commit
    ):
        raise ConfigError(
            f"rollout.thinking_history='drop' works with the append context manager; rollout.context="
            f"{r.context!r} builds its own prompts (use thinking_history='keep' or context='append')"
        )
    if cfg.train.eval_greedy and cfg.train.trainer == "gateway":
        raise ConfigError(
            "train.eval_greedy=true: the gateway trainer evaluates its harness at eval_temperature"
        )
    if r.few_shot and (r.agent not in FEW_SHOT_AGENTS or cfg.train.trainer == "gateway"):
        raise ConfigError(
            f"rollout.few_shot={r.few_shot}: shown by the {' and '.join(FEW_SHOT_AGENTS)} agents of the "
            f"built-in trainers; rollout.agent={r.agent!r}, train.trainer={cfg.train.trainer!r} builds its "
            "own prompts"
        )
    from horizonrl.train.rollout.env_setup import import_env_imports

    import_env_imports(cfg.env.imports)
    check_env_knobs(cfg.env.name, dict(cfg.env.knobs))
    if cfg.inference.engine not in ENGINES:  # membership only: a lazy engine's module is not imported
        raise UnknownNameError(ENGINES.unknown(cfg.inference.engine, field="inference.engine"))
    target = engine_parameters(cfg.inference.engine)
    if target is not None:
        check_kwargs(
            target,
            dict(cfg.inference.params),
            field="inference.params",
            owner=f"engine {cfg.inference.engine!r}",
            skip=TRAINER_SET,
        )


def check_env_knobs(
    name: str, knobs: dict[str, Any], field: str = "env.knobs", name_field: str = "env.name"
) -> None:
    """The environment ``name`` exists and accepts ``knobs`` (its ``validate_knobs``); else ConfigError."""
    from horizonrl.envs import get_env, list_envs
    from horizonrl.train.rollout.env_knobs import resolve_knobs

    if name not in list_envs():
        raise ConfigError(f"{name_field}={name!r}: unknown environment; known: {list_envs()}")
    if not isinstance(knobs, dict):
        raise ConfigError(f"{field}={knobs!r}: expected a mapping of knob names to values")
    validate = getattr(get_env(name), "validate_knobs", None)
    try:
        resolved = resolve_knobs(knobs)
        if validate is not None:
            validate(resolved)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{field}: {e}") from None


def check_run(cfg: RunConfig, *, trainer: bool = True) -> None:
    """:func:`check_names`, then that ``model.device`` exists on this machine."""
    from horizonrl.train.warmstart.bootstrap import resolve_device

    check_names(cfg, trainer=trainer)
    resolve_device(cfg.model.device)


def ensure_dir(path: str | Path, field: str) -> Path:
    """Create directory ``path``; ConfigError naming ``field`` when it is a file or cannot be made."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{field}={str(path)!r}: exists and is not a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ConfigError(f"{field}={str(path)!r}: a parent of it is a file, not a directory") from None
    except PermissionError:
        raise ConfigError(f"{field}={str(path)!r}: permission denied creating the directory") from None
    return p


def check_resume_config(cfg: RunConfig, saved_path: str | Path) -> None:
    """Refuse to resume with a config that differs from the run's saved one (``config.yaml``)
    anywhere but the fields marked ``resume=True`` (:func:`horizonrl.config.resumable_fields`):
    a ConfigError lists each differing field, one line each, ``field: saved -> new``."""
    saved_path = Path(saved_path)
    if not saved_path.is_file():
        warnings.warn(
            f"--resume: {saved_path} is missing, so the config cannot be compared with the run's; "
            "resuming with the given config",
            HorizonWarning,
            stacklevel=3,
        )
        return
    try:
        saved = load_config(saved_path)
    except ConfigError as e:
        raise ConfigError(f"--resume: the run's saved config cannot be read: {e}") from None
    from horizonrl.train.trainers.registry import resumable_params

    allowed = resumable_params(cfg)
    lines = [ln for ln in resume_conflicts(saved, cfg) if ln.split(":", 1)[0] not in allowed]
    if lines:
        raise ConfigError(
            f"--resume: the config differs from the run's saved {saved_path} (only "
            f"{', '.join([*resumable_fields(), *allowed])} may change on resume; start a new run with "
            "train.init=<checkpoint> to change anything else):\n  " + "\n  ".join(lines)
        )
