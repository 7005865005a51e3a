"""Token-exact recording of an external agent's chat-completions calls as horizonrl rollouts.

Every call of an *episode* becomes a :class:`~horizonrl.trajectory.Turn` whose ``prompt_ids`` are the
ids the engine saw (including a tool-call prefill), with the sampled ids and their log-probs. Sessions
(:class:`~horizonrl.trajectory.Segment`) follow the prompts, not the messages:

- **Same session.** A call whose prompt extends the context of an earlier call of the episode
  (that call's prompt + sampled ids) token for token is the next turn of that call's session. To make
  this hold for an ordinary agent loop, which sends back the parsed assistant message (tool calls as
  JSON strings) rather than our ids, :meth:`Recorder.prompt_ids` *splices*: when the request's messages
  are an earlier call's messages, then the assistant message that call returned (same content, same
  tool calls and arguments; ids ignored), then only tool/user messages, the prompt is that call's
  prompt + its sampled ids + an end-of-turn token if it was cut + the rendering of the new messages
  (:meth:`ChatRenderer.continuation_ids`), each its own message (two parallel tool results are two
  tool messages, rendered as the template renders them); the earlier turn keeps them in
  ``info["obs_messages"]``, as the agent loop keeps a step's messages. Anything else is rendered from
  scratch.
- **Rewritten context.** A call that extends no earlier call starts a new session of kind ``normal``
  whose ``parent`` is the previous session (``info["rewrite"]``). When the previous session was such a
  rewrite with a single turn and the new prompt quotes that turn's answer (its ``<summary>`` content, or
  the whole content; at least ``min_summary_chars`` characters), the previous session was a summary
  call: it becomes a ``compaction`` session (``parent``: the session it summarized, ``fork_index``: the
  compaction number, ``info["h_minus"]``: that session's last context, ``info["h_plus"]``: the new
  prompt), and the new session's parent is it — the layout of Mosaic compaction, so its information
  gain and session-aware credit apply. A call may also declare its session's kind with the header
  ``X-Session-Kind`` (``compaction`` for the summary call; the next new session then closes it).
- **Subagents.** An episode that declares a parent (header ``X-Parent-Episode``) records into the
  parent's rollout: each of its sessions is a ``subagent`` segment whose ``parent`` is the parent's
  session that was active when the child started and whose ``fork_index`` numbers the children;
  its first session records ``info["h_minus"]`` (the prompt of that parent session's last turn: the
  context before the forking turn) and, once the parent's session makes its next call,
  ``info["h_plus"]`` (that call's prompt: the context after the results returned).

The outcome comes from :meth:`Recorder.post_reward` (``POST /v1/episodes/{id}/reward``) or a reward
function applied by the trainer to :meth:`Recorder.final_answer`. Nothing is invented: an episode
without a reward is never turned into a rollout with one.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from horizonrl.envs.core.tools import parse_answer
from horizonrl.trajectory import SEGMENT_KINDS, Rollout, Segment, Turn
from horizonrl.vocab import Termination

__all__ = ["EPISODE_ID", "EpisodeError", "Recorder"]

EPISODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
DECLARABLE_KINDS = tuple(k for k in SEGMENT_KINDS if k != "subagent")
_SUMMARY = re.compile(r"<summary>(.*?)(?:</summary>|$)", re.DOTALL)


class EpisodeError(Exception):
    """A request about an episode that cannot be honoured: HTTP ``status``, message naming ``param``."""

    def __init__(self, status: int, message: str, param: str | None = "episode_id"):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


@dataclass
class _Call:
    """What the recorder keeps of one call to splice and link the next ones."""

    messages: list[dict[str, Any]]
    tools_key: str
    prompt_ids: list[int]
    response_ids: list[int]
    returned: dict[str, Any]  # the assistant message the client got back

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.response_ids


@dataclass
class _Episode:
    id: str
    task_id: str
    group_id: str
    uid: str
    parent: str | None = None  # the parent episode (subagents)
    root: str = ""
    rollout: Rollout | None = None  # root episodes only
    segments: list[int] = field(default_factory=list)  # own sessions: indices in the root's rollout
    last_call: dict[int, _Call] = field(default_factory=dict)  # segment index -> its last call
    anchor: int | None = None  # subagents: the parent's segment they were forked from
    fork_index: int | None = None
    status: str = "open"  # open | closed
    reward: float | None = None
    success: bool | None = None
    final_answer: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    calls: int = 0
    finished: bool = False  # the harness said it is done (POST .../finish, or it returned)
    children: int = 0
    compactions: int = 0
    pending_compaction: int | None = None  # a declared compaction session waiting for its h_plus
    waiting_h_plus: dict[int, list[int]] = field(default_factory=dict)  # parent segment -> child segments
    created: float = field(default_factory=time.monotonic)
    updated: float = field(default_factory=time.monotonic)


def _tools_key(tools: list[dict[str, Any]] | None) -> str:
    return json.dumps(tools or [], sort_keys=True)


def _calls_of(message: dict[str, Any]) -> list[tuple[str, Any]]:
    out = []
    for call in message.get("tool_calls") or ():
        fn = call.get("function", call)
        args = fn.get("arguments", {})
        if isinstance(args, str):
            with contextlib.suppress(ValueError, RecursionError):
                args = json.loads(args)
        out.append((fn.get("name"), args))
    return out


def _norm(m: dict[str, Any]) -> tuple:
    """A message as compared across calls: role, content, tool calls (name, parsed arguments)."""
    calls = tuple((name, json.dumps(args, sort_keys=True)) for name, args in _calls_of(m))
    return (m.get("role"), m.get("content") or "", calls)


def _same_assistant(sent: dict[str, Any], returned: dict[str, Any]) -> bool:
    """Whether the client's assistant message is the one we returned (content and calls; ids ignored)."""
    if sent.get("role") != "assistant":
        return False
    same_text = (sent.get("content") or "").strip() == (returned.get("content") or "").strip()
    return same_text and _calls_of(sent) == _calls_of(returned)


def _new_messages(last: _Call, messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The tool/user messages ``messages`` add after ``last``'s messages and the assistant message it
    returned, or None when ``messages`` do not continue ``last`` that way. Each stays its own message:
    two parallel tool results are rendered as the template renders two tool messages in a row."""
    k = len(last.messages)
    if len(messages) <= k or [_norm(m) for m in messages[:k]] != [_norm(m) for m in last.messages]:
        return None
    if not _same_assistant(messages[k], last.returned):
        return None
    rest = list(messages[k + 1 :])
    return None if any(m["role"] == "assistant" for m in rest) else rest


def _obs_message(m: dict[str, Any]) -> dict[str, Any]:
    """A recorded reply message: role, content, and ``tool_call_id``/``name`` where the client sent them."""
    out = {"role": m["role"], "content": m.get("content") or ""}
    out.update({k: m[k] for k in ("tool_call_id", "name") if m.get(k)})
    return out


class Recorder:
    """Episodes → rollouts (module docstring). Thread-safe.

    ``renderer`` is the :class:`~horizonrl.models.chat.ChatRenderer` of the engine's tokenizer.
    ``auto_register``: the first call of an unknown episode registers it (the standalone gateway);
    otherwise only :meth:`register` -ed episodes are served (the trainer).
    """

    def __init__(self, renderer: Any, *, auto_register: bool = True, min_summary_chars: int = 20):
        self.renderer = renderer
        self.tokenizer = renderer.tokenizer
        self.auto_register = auto_register
        self.min_summary_chars = min_summary_chars
        self._episodes: dict[str, _Episode] = {}
        self._lock = threading.RLock()
        self.stats = {"calls": 0, "spliced": 0, "sessions": 0}

    # -- episodes ----------------------------------------------------------------------------------------

    def register(
        self,
        episode_id: str,
        *,
        task_id: str | None = None,
        group_id: str | None = None,
        uid: str | None = None,
        parent: str | None = None,
    ) -> None:
        """Open an episode (``parent``: the episode it is a subagent of)."""
        if not isinstance(episode_id, str) or not EPISODE_ID.match(episode_id):
            raise EpisodeError(
                400,
                f"episode_id: {episode_id!r} is not a valid episode id "
                "(1-128 characters: letters, digits, '.', '_', ':', '-')",
            )
        with self._lock:
            if episode_id in self._episodes:
                raise EpisodeError(409, f"episode_id: episode {episode_id!r} already exists")
            ep = _Episode(
                id=episode_id,
                task_id=task_id if task_id is not None else episode_id,
                group_id=group_id if group_id is not None else episode_id,
                uid=uid if uid is not None else episode_id,
            )
            if parent is not None:
                root = self._open(parent, "X-Parent-Episode")
                ep.parent, ep.root = parent, root.root
                ep.task_id, ep.group_id = root.task_id, root.group_id
                owner = self._episodes[root.root]
                ep.anchor = owner.segments[-1] if owner.segments else None
                ep.fork_index = owner.children
                owner.children += 1
            else:
                ep.root = episode_id
                ep.rollout = Rollout(uid=ep.uid, task_id=ep.task_id, group_id=ep.group_id, segments=[])
            self._episodes[episode_id] = ep

    def _get(self, episode_id: str, param: str = "episode_id") -> _Episode:
        ep = self._episodes.get(episode_id)
        if ep is None:
            raise EpisodeError(404, f"{param}: no episode {episode_id!r} is registered", param)
        return ep

    def _open(self, episode_id: str, param: str = "episode_id") -> _Episode:
        ep = self._get(episode_id, param)
        if ep.status != "open":
            raise EpisodeError(409, f"{param}: episode {episode_id!r} is closed", param)
        return ep

    def ensure(self, episode_id: str, *, parent: str | None = None) -> None:
        """The episode of a call: registered on first use when ``auto_register``; checks the parent."""
        with self._lock:
            ep = self._episodes.get(episode_id)
            if ep is None:
                if not self.auto_register:
                    self._get(episode_id)
                self.register(episode_id, parent=parent)
                return
            self._open(episode_id)
            if parent is not None and ep.parent != parent:
                raise EpisodeError(
                    409,
                    f"X-Parent-Episode: episode {episode_id!r} is not a subagent of {parent!r}",
                    "X-Parent-Episode",
                )

    # -- calls -------------------------------------------------------------------------------------------

    def prompt_ids(self, episode_id: str, messages, tools, prefill_ids: list[int]) -> list[int] | None:
        """The spliced prompt of a call that continues one of the episode's sessions, or None."""
        key = _tools_key(tools)
        with self._lock:
            ep = self._open(episode_id)
            for seg in reversed(ep.segments):
                last = ep.last_call.get(seg)
                if last is None or last.tools_key != key:
                    continue
                rest = _new_messages(last, messages)
                if rest is None:
                    continue
                ids = last.context + self.renderer.end_of_turn_ids(last.response_ids)
                self.stats["spliced"] += 1
                return ids + self.renderer.continuation_ids(rest) + list(prefill_ids)
        return None

    def record(
        self,
        episode_id: str,
        *,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        prompt_ids: list[int],
        response_ids: list[int],
        logprobs: list[float],
        returned: dict[str, Any],
        finish_reason: str,
        prefill_tokens: int = 0,
        session_kind: str | None = None,
    ) -> tuple[int, int]:
        """Record one call; returns ``(segment index, turn index)`` in the root's rollout."""
        if session_kind is not None and session_kind not in DECLARABLE_KINDS:
            raise EpisodeError(
                400,
                f"X-Session-Kind: {session_kind!r} is not one of {list(DECLARABLE_KINDS)} "
                "(declare subagents with X-Parent-Episode)",
                "X-Session-Kind",
            )
        with self._lock:
            ep = self._open(episode_id)
            root = self._episodes[ep.root]
            rollout = root.rollout
            assert rollout is not None
            call = _Call(
                messages=[dict(m) for m in messages],
                tools_key=_tools_key(tools),
                prompt_ids=list(prompt_ids),
                response_ids=list(response_ids),
                returned=copy.deepcopy(returned),
            )
            turn = Turn(
                prompt_ids=list(prompt_ids),
                response_ids=list(response_ids),
                logprobs=[float(x) for x in logprobs],
                response_text=self.tokenizer.decode(response_ids, skip_special_tokens=True),
                truncated=finish_reason == "length",
                tool_calls=len(returned.get("tool_calls") or ()),
                info={
                    "finish_reason": finish_reason,
                    "prefill_tokens": prefill_tokens,
                    "content": returned.get("content"),
                },
            )
            seg_index = self._continued(ep, rollout, prompt_ids)
            if seg_index is None:
                seg_index = self._new_session(ep, root, rollout, prompt_ids, session_kind)
            else:
                seg = rollout.segments[seg_index]
                prev = seg.turns[-1]
                env_ids = prompt_ids[len(prev.prompt_ids) + len(prev.response_ids) :]
                prev.observation = self.tokenizer.decode(env_ids, skip_special_tokens=True)
                last = ep.last_call.get(seg_index)
                rest = _new_messages(last, messages) if last is not None else None
                if rest:  # the separate tool/user messages, as the agent loop records a step's reply
                    prev.info["obs_messages"] = [_obs_message(m) for m in rest]
            seg = rollout.segments[seg_index]
            seg.turns.append(turn)
            for child_seg in root.waiting_h_plus.pop(seg_index, []) if len(seg.turns) > 1 else []:
                rollout.segments[child_seg].info["h_plus"] = list(prompt_ids)
            ep.last_call[seg_index] = call
            ep.calls += 1
            ep.updated = root.updated = time.monotonic()
            self.stats["calls"] += 1
            return seg_index, len(seg.turns) - 1

    def _continued(self, ep: _Episode, rollout: Rollout, prompt: list[int]) -> int | None:
        """The most recent session of ``ep`` whose last context ``prompt`` extends."""
        for seg in reversed(ep.segments):
            last = rollout.segments[seg].turns[-1] if rollout.segments[seg].turns else None
            if last is None:
                continue
            ctx = list(last.prompt_ids) + list(last.response_ids)
            if len(prompt) >= len(ctx) and prompt[: len(ctx)] == ctx:
                return seg
        return None

    def _new_session(self, ep, root: _Episode, rollout: Rollout, prompt: list[int], kind: str | None) -> int:
        self.stats["sessions"] += 1
        index = len(rollout.segments)
        if ep.parent is not None:  # a subagent's session
            seg = Segment(
                kind="subagent", parent=ep.anchor, fork_index=ep.fork_index, info={"episode": ep.id}
            )
            if not ep.segments and ep.anchor is not None:
                anchor = rollout.segments[ep.anchor]
                if anchor.turns:
                    seg.info["h_minus"] = list(anchor.turns[-1].prompt_ids)
                    root.waiting_h_plus.setdefault(ep.anchor, []).append(index)
            rollout.segments.append(seg)
            ep.segments.append(index)
            return index
        mains = root.segments
        prev = mains[-1] if mains else None
        if kind == "compaction":
            summarized = next((i for i in reversed(mains) if rollout.segments[i].kind == "normal"), None)
            seg = Segment(kind="compaction", parent=summarized, fork_index=root.compactions)
            root.compactions += 1
            if summarized is not None and rollout.segments[summarized].turns:
                last = rollout.segments[summarized].turns[-1]
                seg.info["h_minus"] = list(last.prompt_ids) + list(last.response_ids)
            root.pending_compaction = index
        else:
            parent = prev
            if root.pending_compaction is not None:
                rollout.segments[root.pending_compaction].info["h_plus"] = list(prompt)
                parent, root.pending_compaction = root.pending_compaction, None
            elif prev is not None and self._was_summary(rollout, prev, prompt):
                summary = rollout.segments[prev]
                summary.kind, summary.fork_index = "compaction", root.compactions
                summary.info.pop("rewrite", None)
                root.compactions += 1
                if summary.parent is not None and rollout.segments[summary.parent].turns:
                    last = rollout.segments[summary.parent].turns[-1]
                    summary.info["h_minus"] = list(last.prompt_ids) + list(last.response_ids)
                summary.info["h_plus"] = list(prompt)
            seg = Segment(kind=kind or "normal", parent=parent)
            if parent is not None and parent == prev and rollout.segments[prev].kind != "compaction":
                seg.info["rewrite"] = True
        rollout.segments.append(seg)
        root.segments.append(index)
        return index

    def _was_summary(self, rollout: Rollout, prev: int, prompt: list[int]) -> bool:
        seg = rollout.segments[prev]
        if seg.kind != "normal" or len(seg.turns) != 1 or seg.parent is None:
            return False
        content = seg.turns[0].info.get("content") or ""
        m = _SUMMARY.search(content)
        summary = (m.group(1) if m else content).strip()
        if len(summary) < self.min_summary_chars:
            return False
        return summary in self.tokenizer.decode(prompt, skip_special_tokens=True)

    # -- outcomes ----------------------------------------------------------------------------------------

    def post_reward(
        self,
        episode_id: str,
        reward: float,
        *,
        success: bool | None = None,
        final_answer: str | None = None,
        info: dict[str, Any] | None = None,
    ) -> None:
        with self._lock:
            ep = self._get(episode_id)
            if ep.parent is not None:
                raise EpisodeError(
                    400, f"episode_id: {episode_id!r} is a subagent of {ep.root!r}; post the reward there"
                )
            if ep.status != "open":
                raise EpisodeError(409, f"episode_id: episode {episode_id!r} is closed")
            ep.reward = float(reward)
            ep.success = success
            if final_answer is not None:
                ep.final_answer = final_answer
            ep.info.update(info or {})
            ep.updated = time.monotonic()

    def finish(self, episode_id: str, final_answer: str | None = None) -> None:
        """The harness of the episode is done; ``final_answer`` (if given) overrides the recorded one."""
        with self._lock:
            ep = self._get(episode_id)
            ep.finished = True
            if final_answer is not None:
                ep.final_answer = final_answer
            ep.updated = time.monotonic()

    def finished(self, episode_id: str) -> bool:
        with self._lock:
            return self._get(episode_id).finished

    def reward(self, episode_id: str) -> float | None:
        with self._lock:
            return self._get(episode_id).reward

    def final_answer(self, episode_id: str) -> str | None:
        """The posted final answer, else the ``<answer>`` (or whole content) of the last main turn."""
        with self._lock:
            ep = self._get(episode_id)
            if ep.final_answer is not None:
                return ep.final_answer
            assert ep.rollout is not None
            for i in reversed(ep.segments):
                turns = ep.rollout.segments[i].turns
                if turns:
                    content = turns[-1].info.get("content") or ""
                    answer = parse_answer(content)
                    return answer if answer is not None else content.strip()
            return None

    def close(self, episode_id: str) -> None:
        """No more calls or rewards for the episode and its subagents."""
        with self._lock:
            root = self._get(episode_id).root
            for ep in self._episodes.values():
                if ep.root == root:
                    ep.status = "closed"

    def forget(self, episode_id: str) -> None:
        """Drop an episode and its subagents from memory."""
        with self._lock:
            root = self._get(episode_id).root
            for key in [k for k, e in self._episodes.items() if e.root == root]:
                del self._episodes[key]

    def describe(self, episode_id: str) -> dict[str, Any]:
        with self._lock:
            ep = self._get(episode_id)
            root = self._episodes[ep.root]
            return {
                "id": ep.id,
                "root": ep.root,
                "status": ep.status,
                "calls": ep.calls,
                "finished": ep.finished,
                "reward": root.reward,
                "sessions": len(root.rollout.segments) if root.rollout is not None else 0,
            }

    def rollout(self, episode_id: str) -> Rollout:
        """A copy of the root episode's rollout with its outcome (``reward`` 0 and ``env["rewarded"]``
        False while none is posted; :meth:`reward` says which)."""
        with self._lock:
            ep = self._get(episode_id)
            if ep.parent is not None:
                raise EpisodeError(400, f"episode_id: {episode_id!r} is a subagent of {ep.root!r}")
            assert ep.rollout is not None
            r = copy.deepcopy(ep.rollout)
            r.reward = 0.0 if ep.reward is None else ep.reward
            r.success = bool(ep.success) if ep.success is not None else (ep.reward or 0.0) > 0
            r.final_answer = self.final_answer(episode_id)
            subagents = sum(1 for e in self._episodes.values() if e.root == ep.id and e.parent is not None)
            r.env = {
                "episode_id": ep.id,
                "rewarded": ep.reward is not None,
                "info": dict(ep.info),
                "metrics": {"gateway_calls": float(ep.calls), "gateway_subagents": float(subagents)},
            }
            r.termination = Termination.DONE
            return r
