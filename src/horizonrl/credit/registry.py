"""Registry of advantage estimators, addressed by name from configs.

An estimator is a function ``fn(groups: Sequence[Group], **params) -> TokenAdvantages``
whose output is aligned with ``[r for g in groups for r in g.rollouts]``, then
segments, then turns, one float per response token (see :mod:`.broadcast`).
Estimators register themselves in the module that defines them::

    @register_estimator("mosaic", loss_agg_mode="rollout-mean-token-mean", description="...")
    def mosaic(groups, *, rho=0.2): ...

and :func:`get_estimator` returns an :class:`EstimatorSpec`; calling the spec
checks the parameter names and the shape of the result.

The built-in estimators declare their parameters (``algo.estimator_params``) as a frozen dataclass,
one field with a docstring per key, registered with them (``params=``), as trainers declare
``params_cls``; the function then takes them as ``**params`` and builds the dataclass::

    @register_estimator("grpo", params=GRPOParams)
    def grpo(groups, **params): p = GRPOParams(**params); ...

Keyword inputs the trainer computes (``needs``, e.g. ``hidden``) stay explicit keyword parameters.
An estimator registered without ``params=`` (a user's plain keyword function) declares its
parameters by its signature. :meth:`EstimatorSpec.settable` gives either form to the config check
(``horizonrl.train.trainers.checks``).
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from horizonrl.credit.broadcast import check_token_advantages
from horizonrl.registry import Registry, UnknownNameError
from horizonrl.trajectory import Group, TokenAdvantages
from horizonrl.vocab import AggMode

#: The loss aggregation modes an estimator may declare (:class:`horizonrl.vocab.AggMode`).
LOSS_AGG_MODES: tuple[AggMode, ...] = tuple(AggMode)

EstimatorFn = Callable[..., TokenAdvantages]
F = TypeVar("F", bound=EstimatorFn)


class UnknownEstimatorError(UnknownNameError):
    """Raised by :func:`get_estimator` for an unregistered name (a ``KeyError`` and a ``ValueError``)."""


def _signature(fn: EstimatorFn) -> tuple[dict[str, inspect.Parameter], bool]:
    """Keyword parameters of ``fn`` after ``groups`` by name, and whether it takes ``**kwargs``."""
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise TypeError(f"estimator {fn!r} must take the groups as its first positional parameter")
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    named = {p.name: p for p in params[1:] if p.kind in kinds}
    return named, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _hints(obj: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(obj)
    except Exception:  # annotations that do not resolve at run time: callers check by the defaults only
        return {}


@dataclass(frozen=True)
class EstimatorSpec:
    """A registered estimator.

    ``loss_agg_mode`` is the aggregation mode (``horizonrl.losses.aggregate``) the
    method is defined with; a config may override it. ``needs`` names keyword
    inputs the trainer must compute with a model (``gains``, ``scores``,
    ``hidden``; see ``horizonrl.train.trainers.features``). ``agg_source`` says where the
    default aggregation comes from (the paper or reference implementation).
    """

    name: str
    """The name configs give in ``algo.estimator``."""
    fn: EstimatorFn
    """``fn(groups, **params) -> TokenAdvantages`` (module docstring)."""
    loss_agg_mode: str = AggMode.TOKEN_MEAN.value
    """The loss aggregation the method is defined with (:class:`~horizonrl.vocab.AggMode`, a plain string)."""
    description: str = ""
    """One line for ``horizonrl estimators``; the first docstring line of ``fn`` unless given."""
    needs: tuple[str, ...] = ()
    """Keyword inputs the trainer computes with a model and passes to ``fn`` (not config parameters)."""
    agg_source: str = ""
    """Where ``loss_agg_mode`` comes from (the paper or reference implementation)."""
    params_cls: type | None = None
    """The frozen dataclass of the estimator's ``algo.estimator_params`` (None: ``fn``'s signature
    declares them)."""

    @property
    def params(self) -> tuple[str, ...] | None:
        """Names of the parameters the estimator accepts, ``needs`` included (``None``: any)."""
        named, var_kw = _signature(self.fn)
        if self.params_cls is not None:
            return (*named, *(f.name for f in dataclasses.fields(self.params_cls)))
        return None if var_kw else tuple(named)

    def settable(self) -> dict[str, tuple[Any, Any]]:
        """The parameters a config may set (``algo.estimator_params``): name -> ``(type hint, default)``.

        The fields of :attr:`params_cls`, else ``fn``'s keyword parameters, less ``needs``; a hint or
        default that is not there is ``None`` / ``inspect.Parameter.empty``. When :attr:`params` is
        ``None`` (``fn`` takes ``**kwargs`` and declares no dataclass) other names pass as well.
        """
        if self.params_cls is not None:
            hints = _hints(self.params_cls)
            fields = dataclasses.fields(self.params_cls)
            empty = inspect.Parameter.empty
            return {
                f.name: (hints.get(f.name), empty if f.default is dataclasses.MISSING else f.default)
                for f in fields
                if f.name not in self.needs
            }
        named, _ = _signature(self.fn)
        hints = _hints(self.fn)
        return {n: (hints.get(n), p.default) for n, p in named.items() if n not in self.needs}

    def __call__(self, groups: Sequence[Group], **params: Any) -> TokenAdvantages:
        """Run the estimator; unknown parameter names raise ``TypeError`` naming them."""
        accepted = self.params
        if accepted is not None:
            unknown = sorted(set(params) - set(accepted))
            if unknown:
                raise TypeError(
                    f"estimator {self.name!r} got unknown parameter(s) {unknown}; "
                    f"accepted: {list(accepted) or 'none'}"
                )
        groups = list(groups)
        for g in groups:
            if not isinstance(g, Group):
                raise TypeError(f"estimator {self.name!r} expects Group objects, got {type(g).__name__}")
        out = self.fn(groups, **params)
        check_token_advantages(groups, out)
        return out


ESTIMATORS: Registry[EstimatorSpec] = Registry(
    "estimator",
    register_with="@register_estimator(NAME) (horizonrl.credit)",
    error=UnknownEstimatorError,
)


def register_estimator(
    name: str,
    *,
    loss_agg_mode: str = AggMode.TOKEN_MEAN.value,
    description: str = "",
    needs: tuple[str, ...] = (),
    replace: bool = False,
    agg_source: str = "",
    params: type | None = None,
) -> Callable[[F], F]:
    """Decorator registering ``fn`` under ``name`` as an :class:`EstimatorSpec`; returns ``fn`` unchanged.

    ``description`` defaults to the first line of the docstring. Registering a
    taken name raises ``ValueError`` unless ``replace=True`` (even for the same
    function: the new registration may declare other settings). ``params``: the frozen
    dataclass of the estimator's parameters (``fn`` must then take ``**params``).
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(
            f"unknown loss_agg_mode {loss_agg_mode!r}; known modes: {[m.value for m in AggMode]}"
        )

    def decorator(fn: F) -> F:
        if name in ESTIMATORS and not replace:
            raise ValueError(f"estimator {name!r} is already registered (pass replace=True to override)")
        named, var_kw = _signature(fn)  # validates the signature
        if params is not None:
            if not dataclasses.is_dataclass(params) or not var_kw:
                raise TypeError(
                    f"estimator {name!r}: params= must be a dataclass and the function must take **params"
                )
            clash = sorted(set(named) & {f.name for f in dataclasses.fields(params)})
            if clash:
                raise TypeError(f"estimator {name!r}: {clash} are both keyword parameters and params fields")
        doc = (inspect.getdoc(fn) or "").strip().splitlines()
        spec = EstimatorSpec(
            name=name,
            fn=fn,
            loss_agg_mode=str(loss_agg_mode),  # a plain string (YAML, JSON), even from an AggMode
            description=description or (doc[0] if doc else ""),
            needs=tuple(needs),
            agg_source=agg_source,
            params_cls=params,
        )
        ESTIMATORS.register(name, spec, replace=True)  # a taken name was refused above unless replace
        return fn

    return decorator


def get_estimator(name: str) -> EstimatorSpec:
    """The :class:`EstimatorSpec` registered under ``name``.

    Unknown names raise :class:`UnknownEstimatorError` (a ``KeyError``, a ``ValueError``
    and a :class:`~horizonrl.errors.ConfigError`) whose message lists the known names.
    """
    return ESTIMATORS.get(name)


#: Registered estimator names, sorted.
list_estimators = ESTIMATORS.names
