"""Hand-built ECHO rollouts (turns with labelled spans and memory-record sources), shared by the ECHO
credit tests (``tests/credit/test_echo_credit.py``, ``tests/credit/test_echo_graph.py``)."""

from __future__ import annotations

from horizonrl.trajectory import Rollout, Segment, Span, Turn


def make_turn(n: int, *spans: tuple[str, int, int, int | None]) -> Turn:
    """A turn of ``n`` response tokens; each span is ``(label, start, end, source record or None)``."""
    return Turn(
        prompt_ids=[1],
        response_ids=list(range(n)),
        logprobs=[-0.1] * n,
        spans=[Span(label, a, b, src) for label, a, b, src in spans],
    )


def echo_rollout(
    uid: str = "r", reward: float = 1.0, termination: str = "done", info: bool = True
) -> Rollout:
    """Four tool-use turns (sources 0-3), a selection segment, one reconstructed final segment.

    Model-selected: turn 0; kept automatically (latest K = 2): turns 2, 3; not selected: turn 1.
    """
    seg0 = Segment(
        kind="normal",
        turns=[
            make_turn(3, ("action", 0, 3, 0)),
            make_turn(5, ("finding", 0, 2, 0), ("action", 2, 5, 1)),
            make_turn(6, ("finding", 0, 2, 1), ("action", 2, 5, 2)),  # token 5 unlabelled
            make_turn(4, ("finding", 0, 2, 2), ("action", 2, 4, 3)),
        ],
    )
    seg1 = Segment(kind="selection", turns=[make_turn(3)], parent=0)  # whole message is a selection
    seg2 = Segment(
        kind="normal",
        turns=[make_turn(4, ("finding", 0, 2, 3), ("answer", 2, 4, None))],
        parent=0,
        info={"selected": [0], "kept_latest": [2, 3]} if info else {},
    )
    return Rollout(
        uid=uid,
        task_id="t",
        group_id="g",
        segments=[seg0, seg1, seg2],
        reward=reward,
        termination=termination,
    )


def single_segment(uid: str, reward: float) -> Rollout:
    """One segment of two turns: an action (source 0), then a finding of record 0 and the answer."""
    seg = Segment(
        turns=[make_turn(3, ("action", 0, 3, 0)), make_turn(4, ("finding", 0, 2, 0), ("answer", 2, 4, None))]
    )
    return Rollout(uid=uid, task_id="t", group_id="g", segments=[seg], reward=reward)
