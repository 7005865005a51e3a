"""Declarations of paper reproductions: arms, a shared warm start, a budget, the claim.

A :class:`Paper` names a packaged base config, the overrides that define its
warm start and regime, and the arms (each a list of ``section.field=value``
overrides of the base). Everything else — seeds, held-out size, budget, gate —
has a default here and can be changed from the command line
(``horizonrl reproduce NAME --seeds 3``). Papers register themselves with
:func:`register_paper` into :data:`PAPERS`; this module knows none of them: the
package (:mod:`horizonrl.reproduce`) imports the built-in declarations
(:mod:`horizonrl.reproduce.papers`) when it is imported, which every import of
this module does first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from horizonrl.registry import Registry


def check_miss(row: dict[str, Any]) -> str:
    """'' for a passed check row, 'FAILED' for a missed gating one, 'missed (reported, not a gate)' else."""
    if row.get("ok", True):
        return ""
    return "FAILED" if row.get("gate", True) else "missed (reported, not a gate)"


@dataclass(frozen=True)
class Arm:
    """One method of a comparison: config overrides on top of the paper's base."""

    name: str
    overrides: tuple[str, ...] = ()
    label: str = ""
    help: str = ""
    scenario: str = ""  # a key of Paper.scenarios: the arm starts from that scenario's warm start


@dataclass(frozen=True)
class Comparison:
    """A paired difference to report: ``arm - baseline`` of end pass@1 (and ``metric`` diffs)."""

    arm: str
    baseline: str
    claim: str = ""


@dataclass(frozen=True)
class Paper:
    """A reproduction (see the module docstring)."""

    name: str
    title: str
    claim: str
    base: str  # packaged config name (src/horizonrl/configs/NAME.yaml)
    arms: tuple[Arm, ...]
    comparisons: tuple[Comparison, ...]
    overrides: tuple[str, ...] = ()  # regime + warm start (apply to every stage)
    #: Named regimes with their own warm start (e.g. Mosaic's compaction and forking): each arm names
    #: one; its overrides apply after ``overrides``, and each scenario is gated and checked separately.
    scenarios: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: False: RL starts from ``model.path`` itself (a pretrained model such as ``smollm2``), no SFT
    #: warm start; the gate then measures that model on the training distribution
    sft_warm_start: bool = True
    budget_tokens: int = 200_000  # generated tokens per arm-seed
    seeds: int = 5
    eval_tasks: int = 256
    eval_samples: int = 1
    eval_temperature: float = 1.0
    eval_seed: int = 20261201
    #: also decode every held-out task once greedily at each evaluation (``train.eval_greedy``): the page
    #: then reports start and end greedy beside sampled, so sharpening (greedy already solved it) is told
    #: apart from learning (greedy rises too)
    eval_greedy: bool = False
    gate: tuple[float, float] = (0.25, 0.75)
    gate_tasks: int = 128
    gate_samples: int = 2
    max_steps: int = 10_000  # a cap; the token budget ends the runs
    #: checkpoint every arm-seed run every N steps (0: only at its end), so a reproduction stopped part
    #: way through a long run resumes it from there (real models: an arm-seed can take hours)
    checkpoint_every: int = 0
    diagnostics: tuple[str, ...] = ()  # metric keys averaged over each run's steps
    #: metric keys (averaged over each run's steps, like ``diagnostics``) shown in a table of their own,
    #: one row per arm-seed beside its end pass@1: what sets a collapsed seed apart
    per_seed: tuple[str, ...] = ()
    #: diagnostic keys whose paired difference (arm - baseline, same seed) each comparison also reports
    #: with a t-interval over seeds: a claim about behaviour, not accuracy (Mosaic: fewer sessions)
    paired_metrics: tuple[str, ...] = ()
    #: metric keys of the share of groups whose advantages are all zero, in order of preference: a run's
    #: ``zero_adv_group_rate`` (``result.json``) is the per-step mean of the first one it reports (a
    #: method trainer that reports its own, e.g. RTPO's ``rtpo/zero_adv_rate``, is declared by its paper)
    zero_adv_metrics: tuple[str, ...] = ("train/zero_adv_group_rate",)
    #: Checks of the regime before any RL (e.g. with the scripted expert): ``fn(cfg) -> rows``,
    #: each row ``{"name", "value", "target", "ok", "gate"}``; a failed row refuses to start like the gate
    #: unless its ``gate`` is false (a claim reported, not a precondition).
    checks: Callable[[Any], list[dict[str, Any]]] | None = None
    #: Checks of the warm start's own rollouts, ``fn(cfg, model_dir) -> rows`` (rows named
    #: ``warm start: ...``), recorded and gating like ``checks``: does the policy RL starts from
    #: exercise the mechanism (e.g. session counts that differ within a group)?
    warm_checks: Callable[[Any, Any], list[dict[str, Any]]] | None = None
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def scenario_names(self) -> list[str]:
        """The scenarios the arms use, in arm order ("" = the paper's base regime)."""
        return list(dict.fromkeys(a.scenario for a in self.arms))

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(f"paper {self.name!r} has no arm {name!r}; arms: {[a.name for a in self.arms]}")


PAPERS: Registry[Callable[[], Paper]] = Registry(
    "reproduction", register_with="@register_paper(NAME) on a function returning a Paper"
)


def register_paper(name: str) -> Callable[[Callable[[], Paper]], Callable[[], Paper]]:
    """Register a zero-argument function returning the :class:`Paper` ``name``."""
    return PAPERS.register(name)


def get_paper(name: str) -> Paper:
    """The :class:`Paper` registered as ``name`` (:class:`~horizonrl.registry.UnknownNameError`, a
    ``KeyError``, naming the known ones)."""
    return PAPERS.get(name)()


#: Names of the registered reproductions, sorted.
list_papers = PAPERS.names
