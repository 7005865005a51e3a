"""Registry of advantage estimators, addressed by name from configs.

An estimator is a function ``fn(groups: Sequence[Group], **params) -> TokenAdvantages``
whose output is aligned with ``[r for g in groups for r in g.rollouts]``, then
segments, then turns, one float per response token (see :mod:`.broadcast`).
Estimators register themselves in the module that defines them::

    @register_estimator("mosaic", loss_agg_mode="rollout-mean-token-mean", description="...")
    def mosaic(groups, *, rho=0.2): ...

and :func:`get_estimator` returns an :class:`EstimatorSpec`; calling the spec
checks the parameter names and the shape of the result.
"""

from __future__ import annotations

import inspect
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


def _param_names(fn: EstimatorFn) -> tuple[str, ...] | None:
    """Keyword parameters accepted after ``groups``; ``None`` when ``fn`` takes ``**kwargs``."""
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise TypeError(f"estimator {fn!r} must take the groups as its first positional parameter")
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return tuple(
        p.name
        for p in params[1:]
        if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    )


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
    fn: EstimatorFn
    loss_agg_mode: str = AggMode.TOKEN_MEAN.value
    description: str = ""
    needs: tuple[str, ...] = ()
    agg_source: str = ""

    @property
    def params(self) -> tuple[str, ...] | None:
        """Names of the parameters the estimator accepts (``None``: any)."""
        return _param_names(self.fn)

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
) -> Callable[[F], F]:
    """Decorator registering ``fn`` under ``name`` as an :class:`EstimatorSpec`; returns ``fn`` unchanged.

    ``description`` defaults to the first line of the docstring. Registering a
    taken name raises ``ValueError`` unless ``replace=True`` (even for the same
    function: the new registration may declare other settings).
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(
            f"unknown loss_agg_mode {loss_agg_mode!r}; known modes: {[m.value for m in AggMode]}"
        )

    def decorator(fn: F) -> F:
        if name in ESTIMATORS and not replace:
            raise ValueError(f"estimator {name!r} is already registered (pass replace=True to override)")
        _param_names(fn)  # validates the signature
        doc = (inspect.getdoc(fn) or "").strip().splitlines()
        spec = EstimatorSpec(
            name=name,
            fn=fn,
            loss_agg_mode=str(loss_agg_mode),  # a plain string (YAML, JSON), even from an AggMode
            description=description or (doc[0] if doc else ""),
            needs=tuple(needs),
            agg_source=agg_source,
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
