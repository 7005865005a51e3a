"""ECHO: provenance-guided (traceable) credit assignment (docs/spec/echo.md "Credit"; paper §4.3, Eq. 13-15).

For each generated token ``q`` of rollout ``n`` the ECHO agent records (paper §4.3, Algorithm 1):

- ``g_q``: the token is in the final segment (the context after the last reconstruction);
- ``d_q``: source turn of an ``action`` token (-1: none);
- ``f_q``: source turn of a ``finding`` token (the ``<sum_last_turn>`` record; -1: none);
- ``b_q``: the token belongs to a memory-selection span.

With ``I_src`` the source turns rendered into the final reconstructed context (model-selected
turns after repair *and* the latest ``K`` turns kept automatically), the credit mask (Eq. 13) is::

    mu_q = 1[g_q = 1  or  d_q in I_src  or  f_q in I_src  or  b_q = 1]

and the token credit (Eq. 14) is ``A~_q = max(A, 0) * mu_q`` with ``A`` the GRPO advantage of the
rollout over its group's *valid* rollouts. A rollout that never reconstructed (one segment) is a
single final segment, so every generated token is credited.

Where the data lives in a :class:`~horizonrl.trajectory.Rollout` (the contract with the ECHO agent):

- ``action`` / ``finding`` / ``selection`` :class:`~horizonrl.trajectory.Span` s on each turn, with
  ``source_turn`` = the agent's memory index ``i`` of record ``e_i`` (rollout-global numbering, the
  same numbers as the selected set). Per Algorithm 1 line 20 the whole non-finding part of a tool-use
  message is its ``action`` span; unlabelled tokens are credited only in the final segment.
- Every token of a segment of kind ``"selection"`` counts as a selection token (``b = 1``), as if it
  carried a ``selection`` span (Algorithm 1 line 28 tags the whole selection message).
- ``I_src`` is read from the **last segment's** ``info["selected"]`` (the repaired index set the agent
  used to build that segment's context), united with ``info["kept_latest"]`` when the agent records
  the automatically kept turns separately. When the last segment has no ``"selected"`` key,
  ``rollout.env["echo"]["selected"]`` (and ``["kept_latest"]``) is used instead. A multi-segment
  rollout with neither raises ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from horizonrl.credit import side_info
from horizonrl.credit.echo_graph import (
    AGGREGATIONS,
    GRAPH_VERSIONS,
    GraphCycleError,
    graph_coefficients,
    graph_weights,
    memory_graph,
    read_selected,
)
from horizonrl.credit.group import valid_group_advantage
from horizonrl.credit.registry import register_estimator
from horizonrl.trajectory import Group, Rollout, TokenAdvantages
from horizonrl.vocab import Termination

SIGN_RULES = ("positive", "signed")
#: ``Rollout.termination`` values that make a rollout invalid for ECHO's group baseline.
ECHO_INVALID_TERMINATIONS = (Termination.ERROR.value,)
OVERLONG_RULES = ("failure", "exclude")
CREDIT_RULES = ("token", "graph")


def provenance_mask(
    final: ArrayLike,
    action_turn: ArrayLike,
    finding_turn: ArrayLike,
    selection: ArrayLike,
    selected: Iterable[int],
) -> np.ndarray:
    """ECHO's token credit mask ``mu`` (paper Eq. 13), one bool per generated token::

        mu_q = final_q or action_turn_q in I_src or finding_turn_q in I_src or selection_q

    ``final``/``selection``: per-token booleans (``g``, ``b``); ``action_turn``/``finding_turn``:
    per-token source-turn ids (``d``, ``f``), ``-1`` (any negative) for none; ``selected``: the set
    ``I_src`` of source turns in the final context. Negative ids in ``selected`` never match.
    """
    g = np.asarray(final, dtype=bool)
    d = np.asarray(action_turn, dtype=np.int64)
    f = np.asarray(finding_turn, dtype=np.int64)
    b = np.asarray(selection, dtype=bool)
    shapes = {x.shape for x in (g, d, f, b)}
    if len(shapes) != 1 or g.ndim != 1:
        raise ValueError(
            f"provenance arrays must be 1-D of one length, got shapes {[x.shape for x in (g, d, f, b)]}"
        )
    src = np.fromiter((int(i) for i in selected if int(i) >= 0), dtype=np.int64)
    return g | b | ((d >= 0) & np.isin(d, src)) | ((f >= 0) & np.isin(f, src))


@dataclass(frozen=True)
class Provenance:
    """Per-token provenance of one rollout, tokens in segment → turn → token order.

    ``lengths[s][t]`` is the number of generated tokens of turn ``t`` of segment ``s``;
    ``reconstructed`` is ``len(segments) > 1``.
    """

    final: np.ndarray
    action_turn: np.ndarray
    finding_turn: np.ndarray
    selection: np.ndarray
    selected: frozenset[int]
    lengths: tuple[tuple[int, ...], ...]
    reconstructed: bool

    def mask(self, *, dense: bool = False) -> np.ndarray:
        """Flat credit mask (Eq. 13); all True when ``dense`` or the rollout never reconstructed."""
        if dense or not self.reconstructed:
            return np.ones(self.final.shape, dtype=bool)
        return provenance_mask(self.final, self.action_turn, self.finding_turn, self.selection, self.selected)


def selected_source_turns(rollout: Rollout) -> frozenset[int]:
    """``I_src``: source turns in the final reconstructed context (see the module docstring).

    Last segment's ``info["selected"] ∪ info["kept_latest"]``, else ``rollout.env["echo"]``'s;
    empty for a rollout with at most one segment; ``ValueError`` for a reconstructed rollout that
    recorded neither.
    """
    if len(rollout.segments) <= 1:
        return frozenset()
    found = read_selected(rollout.segments[-1].info, "segments[-1].info")
    if found is None:
        echo_env = rollout.env.get("echo")
        found = read_selected(echo_env, 'env["echo"]') if isinstance(echo_env, dict) else None
    if found is None:
        raise ValueError(
            f"rollout {rollout.uid!r} has {len(rollout.segments)} segments but no selected source turns: "
            'record them in segments[-1].info["selected"] or rollout.env["echo"]["selected"]'
        )
    return found


def _fill(arr: np.ndarray, start: int, end: int, value: int, what: str) -> None:
    part = arr[start:end]
    if np.any((part >= 0) & (part != value)):
        raise ValueError(f"overlapping {what} spans with different source turns at [{start}, {end})")
    part[:] = value


def rollout_provenance(rollout: Rollout) -> Provenance:
    """Derive ``g, d, f, b`` and ``I_src`` from a rollout's spans and segments (paper §4.3).

    ``g``: tokens of the last segment. ``d``/``f``: ``source_turn`` of ``action``/``finding`` spans
    (``-1`` outside them or when ``source_turn`` is None; overlapping spans of one label must agree).
    ``b``: tokens of ``selection`` spans or of segments of kind ``"selection"``.
    """
    n_seg = len(rollout.segments)
    g, d, f, b, lengths = [], [], [], [], []
    for s, seg in enumerate(rollout.segments):
        seg_lengths = []
        for turn in seg.turns:
            n = turn.num_response_tokens
            seg_lengths.append(n)
            act = np.full(n, -1, dtype=np.int64)
            fnd = np.full(n, -1, dtype=np.int64)
            sel = np.full(n, seg.kind == "selection", dtype=bool)
            for sp in turn.spans:
                if sp.label == "selection":
                    sel[sp.start : sp.end] = True
                elif sp.label in ("action", "finding") and sp.source_turn is not None and sp.source_turn >= 0:
                    _fill(
                        act if sp.label == "action" else fnd, sp.start, sp.end, int(sp.source_turn), sp.label
                    )
            g.append(np.full(n, s == n_seg - 1, dtype=bool))
            d.append(act)
            f.append(fnd)
            b.append(sel)
        lengths.append(tuple(seg_lengths))

    def cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

    return Provenance(
        final=cat(g, bool),
        action_turn=cat(d, np.int64),
        finding_turn=cat(f, np.int64),
        selection=cat(b, bool),
        selected=selected_source_turns(rollout),
        lengths=tuple(lengths),
        reconstructed=n_seg > 1,
    )


def _unflatten(flat: np.ndarray, lengths: tuple[tuple[int, ...], ...]) -> list[list[np.ndarray]]:
    out, pos = [], 0
    for seg_lengths in lengths:
        row = []
        for n in seg_lengths:
            row.append(flat[pos : pos + n])
            pos += n
        out.append(row)
    return out


def echo_token_mask(rollout: Rollout, *, dense: bool = False) -> list[list[np.ndarray]]:
    """The credit mask ``mu`` of one rollout as ``[segment][turn] -> bool array`` (Eq. 13).

    ``dense=True`` (all True) does not read the provenance at all.
    """
    if dense:
        return [[np.ones(t.num_response_tokens, dtype=bool) for t in seg.turns] for seg in rollout.segments]
    prov = rollout_provenance(rollout)
    return _unflatten(prov.mask(dense=dense), prov.lengths)


@dataclass(frozen=True)
class ECHOParams:
    """The parameters of ``echo`` (``algo.estimator_params``; :func:`echo` gives the rules in full)."""

    sign_rule: str = "positive"
    """``positive``: ``max(A, 0)`` (the paper, Eq. 14); ``signed``: ``A`` itself (older released code)."""
    dense: bool = False
    """Credit every generated token instead of the traceable mask ``mu`` (the "w/o Traceable CA"
    ablation with ``sign_rule="signed"``)."""
    invalid_terminations: Sequence[str] = ECHO_INVALID_TERMINATIONS
    """``Rollout.termination`` values that make a rollout invalid: out of the group's mean/std and 0
    on every token (default ``("error",)``; one string counts as a one-element list)."""
    overlong: str = "failure"
    """Overlong rollouts are failures in the baseline with reward 0 (``failure``, paper §5.1/C.1) or
    leave it (``exclude``, the released rule, :func:`_excludes_overlong`); either way 0 on their tokens."""
    normalize_std: bool = True
    """Divide the group advantage by the std of the valid rewards."""
    eps: float = 1e-6
    """Added to that std."""
    std_ddof: int = 1
    """1: sample std (the paper's GRPO); 0: population std (the authors' released baseline)."""
    credit: str = "token"
    """``token``: the binary mask ``mu`` (the paper); ``graph``: memory-graph weights ``w_q``
    (:mod:`horizonrl.credit.echo_graph`, the authors' newer released code)."""
    gamma_turn: float = 1.0
    """Graph credit: decay per turn along memory edges, in [0, 1]."""
    gamma_segment: float = 0.9
    """Graph credit: decay per segment (reconstruction) crossed, in [0, 1]."""
    graph_aggregation: str = "sum"
    """Graph credit: how a node's paths to the outcome combine, ``sum`` or ``max``."""
    graph_clip: float | None = 1.0
    """Graph credit: cap on a node's weight (positive; None: no cap)."""
    graph_version: int = 2
    """Graph credit: 2 (typed memory graph) or 1 (untyped)."""
    neg_penalty: float = 0.0
    """In [0, 1] (released ``ECHO_NEG_PENALTY_RATIO``; 0 is the paper): a rollout with ``A < 0`` gets
    ``neg_penalty * A`` on every generated token; needs ``sign_rule="positive"``."""

    def __post_init__(self) -> None:
        if self.sign_rule not in SIGN_RULES:
            raise ValueError(f"sign_rule must be one of {SIGN_RULES}, got {self.sign_rule!r}")
        if self.std_ddof not in (0, 1):
            raise ValueError(f"std_ddof must be 0 (population std) or 1 (sample std), got {self.std_ddof!r}")
        if self.overlong not in OVERLONG_RULES:
            raise ValueError(f"overlong must be one of {OVERLONG_RULES}, got {self.overlong!r}")
        if self.credit not in CREDIT_RULES:
            raise ValueError(f"credit must be one of {CREDIT_RULES}, got {self.credit!r}")
        if self.graph_aggregation not in AGGREGATIONS:
            raise ValueError(
                f"graph_aggregation must be one of {AGGREGATIONS}, got {self.graph_aggregation!r}"
            )
        for name, v in (
            ("gamma_turn", self.gamma_turn),
            ("gamma_segment", self.gamma_segment),
            ("neg_penalty", self.neg_penalty),
        ):
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be a number in [0, 1], got {v!r}")
        if self.graph_clip is not None and (
            isinstance(self.graph_clip, bool)
            or not isinstance(self.graph_clip, int | float)
            or self.graph_clip <= 0
        ):
            raise ValueError(f"graph_clip must be a positive number or null, got {self.graph_clip!r}")
        if self.neg_penalty > 0 and self.sign_rule != "positive":
            raise ValueError(
                "neg_penalty > 0 adds the dense negative update to the positive rule; "
                "use sign_rule='positive'"
            )
        if self.graph_version not in GRAPH_VERSIONS:
            raise ValueError(f"graph_version must be one of {GRAPH_VERSIONS}, got {self.graph_version!r}")


@register_estimator("echo", loss_agg_mode="token-mean", params=ECHOParams)
def echo(groups: Sequence[Group], **params: Any) -> TokenAdvantages:
    """ECHO traceable credit: A~_q = max(A, 0) * mu_q over valid-rollout GRPO (docs/spec/echo.md, Eq. 13-14).

    - ``A``: :func:`valid_group_advantage`; a rollout is *valid* unless its ``termination`` is in
      ``invalid_terminations`` (default ``("error",)``). Invalid rollouts are left out of the
      mean/std and get 0 on every token. Overlong rollouts (more reconstructions than allowed, or a
      rebuilt prompt still over budget) are, with ``overlong="failure"`` (default; paper §5.1/C.1:
      "treated as unsuccessful"), failures *in* the baseline with reward 0, and get 0 on their own
      tokens; ``overlong="exclude"`` leaves them out of the baseline as well, except that a group with
      exactly one other valid rollout keeps them as failures (the released code's rule,
      :func:`_excludes_overlong`).
    - ``std_ddof``: 1 (sample std, the paper's GRPO) or 0 (population std). The authors' released
      group baseline is ``overlong="exclude", std_ddof=0``: overlong rollouts leave the statistics
      while at least two valid ones remain (docs/released_recipes.md).
    - ``sign_rule="positive"`` (the paper, Eq. 14): ``max(A, 0)``, so tied, below-baseline and
      all-correct / all-wrong groups give zero update. ``"signed"``: ``A`` itself (the authors' older
      released code; their newer code takes the positive part, as the paper does).
    - ``mu``: :func:`echo_token_mask`; ``dense=True`` credits every generated token (the paper's
      "w/o Traceable CA" ablation is ``dense=True, sign_rule="signed"``: plain GRPO over ECHO rollouts).

    - ``credit="graph"`` (the authors' newer released code, not the paper): instead of the binary
      ``mu``, positive credit ``max(A, 0) * w_q`` with ``w`` the memory-graph weights of
      :mod:`horizonrl.credit.echo_graph` (``graph_version`` 2 typed | 1 untyped, ``gamma_turn``,
      ``gamma_segment``, ``graph_aggregation`` sum | max, ``graph_clip``; None: no cap; the released
      defaults). A rollout whose graph has a cycle falls back to ``mu``.
    - ``neg_penalty`` in [0, 1] (released code's ``ECHO_NEG_PENALTY_RATIO``; 0 = the paper): a rollout
      with ``A < 0`` gets ``neg_penalty * A`` on every generated token (dense, no mask), so failures
      are pushed down too; positive credit is unchanged. Needs ``sign_rule="positive"``.

    Trainer defaults for ECHO (docs/spec/echo.md "Loss", docs/spec/baselines.md): ``token-mean`` aggregation,
    PPO clip ``e_lo = 0.2, e_hi = 0.28`` (dual clip ``c = 3``), no KL penalty. ``params``:
    :class:`ECHOParams`.
    """
    p = ECHOParams(**params)
    graph = {
        "gamma_turn": p.gamma_turn,
        "gamma_segment": p.gamma_segment,
        "aggregation": p.graph_aggregation,
        "clip": p.graph_clip,
    }
    base_bad = (
        {p.invalid_terminations} if isinstance(p.invalid_terminations, str) else set(p.invalid_terminations)
    )
    out: TokenAdvantages = []
    for group in groups:
        bad = set(base_bad)
        if p.overlong == "exclude" and _excludes_overlong(group, base_bad):
            bad.add(Termination.OVERLONG.value)
        valid = [r.termination not in bad for r in group.rollouts]
        rewards = [0.0 if r.termination == Termination.OVERLONG else r.reward for r in group.rollouts]
        signed = valid_group_advantage(
            rewards, valid, normalize_std=p.normalize_std, eps=p.eps, ddof=p.std_ddof
        )
        adv = np.maximum(signed, 0.0) if p.sign_rule == "positive" else signed
        trained = [
            ok and r.termination != Termination.OVERLONG for r, ok in zip(group.rollouts, valid, strict=True)
        ]
        for rollout, a, raw, ok in zip(group.rollouts, adv, signed, trained, strict=True):
            side_info.record_side_info(len(out), rollout={"valid": ok, "A": float(a)})
            if not ok:  # may have stopped mid-selection with no final context: no mask needed
                out.append([[np.zeros(t.num_response_tokens) for t in seg.turns] for seg in rollout.segments])
                continue
            if p.neg_penalty > 0 and raw < 0:  # the released dense update of a failed rollout
                value = float(p.neg_penalty * raw)
                out.append(
                    [[np.full(t.num_response_tokens, value) for t in seg.turns] for seg in rollout.segments]
                )
                continue
            if p.credit == "graph" and not p.dense and len(rollout.segments) > 1:
                weights = _graph_token_weights(len(out), rollout, graph, p.graph_version)
                if weights is not None:
                    out.append([[float(a) * w for w in seg] for seg in weights])
                    continue
            mask = echo_token_mask(rollout, dense=p.dense)
            if side_info.collecting():
                _record_side_info(len(out), rollout, mask, p.dense)
            out.append([[np.where(m, float(a), 0.0) for m in seg] for seg in mask])
    return out


def _excludes_overlong(group: Group, bad: set[str]) -> bool:
    """``overlong="exclude"`` as the released code applies it: overlong rollouts leave the baseline
    unless exactly one other valid rollout would remain in a group of several, which then keeps the
    overlong ones as failures (reward 0); with none left every rollout gets 0 either way."""
    kept = sum(r.termination not in bad and r.termination != Termination.OVERLONG for r in group.rollouts)
    return not (kept == 1 and len(group.rollouts) > 1)


def _graph_token_weights(
    index: int, rollout: Rollout, graph: dict, version: int
) -> list[list[np.ndarray]] | None:
    """Graph weights ``[segment][turn]`` of one rollout; None (token mask instead) on a cycle."""
    dag = memory_graph(rollout, version)
    try:
        coef, metrics = graph_coefficients(dag, **graph)
    except GraphCycleError:
        return None
    prov = rollout_provenance(rollout)
    per_segment = []
    for s in range(len(rollout.segments)):
        # version 2: a selection segment's tokens weigh what its downstream node does (the outcome: 1);
        # version 1 (and any selection span without a recorded event there): 1
        value = 1.0
        if version == 2 and s in dag.selections:
            down = dag.selections[s]
            value = 1.0 if down is None else coef.get(down, 0.0)
        per_segment.append(np.full(sum(prov.lengths[s]), value))
    sel_w = np.concatenate(per_segment) if per_segment else np.zeros(0)
    flat = graph_weights(prov.final, prov.action_turn, prov.finding_turn, prov.selection, coef, sel_w)
    side_info.record_side_info(
        index, rollout={"graph": {"coef": {str(k): v for k, v in coef.items()}, **metrics}}
    )
    return _unflatten(flat, prov.lengths)


def _record_side_info(index: int, rollout: Rollout, mask: list[list[np.ndarray]], dense: bool) -> None:
    """Viewer side information: ``I_src`` (selected source turns) and the credit mask ``mu`` per turn."""
    selected = sorted(selected_source_turns(rollout)) if not dense else None
    turns = [[{"mask": "".join("1" if x else "0" for x in m)} for m in seg] for seg in mask]
    side_info.record_side_info(index, rollout={"selected": selected}, turns=turns)
