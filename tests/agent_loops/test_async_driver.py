"""The episode-level asynchronous driver (``rollout.driver: async``) samples what the round-synchronous
driver samples with path seeds, whatever the timing, and runs environment steps at the same time.

What is checked: every request is sampled from its path seed, so the asynchronous driver gives the
rollouts the round-synchronous driver gives with path seeds, whatever the timing (synthetic programs
with subagents and uneven environment steps; the real ``react``/``fork`` agents; the tiny model through
the HF engine); environment steps of different rollouts really run at the
same time; a failing program or engine is raised, not hung on; and training with it keeps the
rollout/train ratio at 1.
"""

from __future__ import annotations

import threading
import time
import types

import numpy as np
import pytest
import torch

from helpers.shaped_env import arith_run_config, rtpo_run_config
from horizonrl.agents import AgentSpec, LoopLimits
from horizonrl.agents.driver import DriverOptions, Generate, Spawn, drive
from horizonrl.agents.registry import make_program
from horizonrl.agents.scheduler import DriveStats, drive_async
from horizonrl.config import load_config
from horizonrl.envs import get_env
from horizonrl.envs.core.tools import format_answer, format_tool_call
from horizonrl.errors import ConfigError
from horizonrl.inference import HFEngine
from horizonrl.inference.base import Engine, Generation, SamplingParams
from horizonrl.inference.prefix_store import common_prefix
from horizonrl.inference.seeding import RequestSeeds, path_seed
from horizonrl.models import ChatRenderer
from horizonrl.train.methods.rtpo import RTPOTrainer, agent_turns
from horizonrl.train.records.metrics import read_metrics
from horizonrl.train.rollout.budget import BudgetedEngine, TokenBudget
from horizonrl.train.rollout.workers import check_driver
from horizonrl.train.trainers.group import GroupTrainer
from horizonrl.trajectory import read_jsonl

P = SamplingParams(max_new_tokens=4)
Q = SamplingParams(max_new_tokens=2, temperature=0.5)


class SeedEcho(Engine):
    """Answers each prompt with ``[seed, len(prompt)]``; records every call's prompts."""

    supports_seeds = True

    def __init__(self, seed=0, delay=0.0):
        self.rng = RequestSeeds(seed)
        self.calls: list[list[tuple[int, ...]]] = []
        self.delay = delay

    def draw_seeds(self, n):
        return self.rng.draw(n)

    def generate(self, prompts, params, *, seeds=None):
        assert seeds is not None and len(seeds) == len(prompts)
        self.calls.append([tuple(p) for p in prompts])
        time.sleep(self.delay)
        return [
            Generation([s, len(p)], [-1.0, -1.0], str(s), "stop") for p, s in zip(prompts, seeds, strict=True)
        ]

    def score(self, contexts, continuations):  # pragma: no cover - unused
        raise NotImplementedError


def _child(tag, pause):
    out = []
    for k in range(2):
        time.sleep(pause)
        out.append((yield Generate([tag, k], Q)).ids)
    return out


def _root(i):
    """Uneven turn counts and environment steps; odd rollouts fork two subagents, one of which forks."""
    out = []
    for turn in range(1 + i % 3):
        time.sleep(0.002 * ((7 * i + turn) % 5))
        out.append((yield Generate([i, turn], P)).ids)
    if i % 2:
        out.append((yield Spawn([_child(100 + i, 0.003), _grandparent(200 + i)])))
    out.append((yield Generate([i, 99], P)).ids)
    return out


def _grandparent(tag):
    first = (yield Generate([tag], P)).ids
    return [first, (yield Spawn([_child(tag + 1000, 0.0), _child(tag + 2000, 0.001)]))]


def test_path_seed_is_a_fixed_function_of_seed_and_path():
    # Computed by hand from the definition: SplitMix64 chain, top 62 bits.
    def mix(x):
        m = (1 << 64) - 1
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & m
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB & m
        return x ^ (x >> 31)

    x = mix(mix(12345) + 1 * 0x9E3779B97F4A7C15 & ((1 << 64) - 1))
    assert path_seed(12345, (0,)) == x >> 2
    seen = {path_seed(7, (a, b, c)) for a in range(6) for b in range(6) for c in range(6)}
    assert len(seen) == 216 and all(0 <= s < 2**62 for s in seen)
    assert path_seed(7, (1, 2)) != path_seed(7, (2, 1)) != path_seed(8, (2, 1))


@pytest.mark.parametrize("threads", [1, 4])
def test_async_gives_the_rollouts_of_sync_with_path_seeds(threads):
    sync_engine, async_engine = SeedEcho(seed=3), SeedEcho(seed=3, delay=0.002)
    sync = drive(sync_engine, [_root(i) for i in range(9)], mode="sync", path_seeds=True)
    stats = DriveStats()
    got = drive_async(async_engine, [_root(i) for i in range(9)], threads=threads, stats=stats)
    assert got == sync
    # every request was a separate seed, and the same set of requests reached both engines
    answers = [a for r in sync for a in _flatten(r)]
    assert len(set(answers)) == len(answers) > 40
    assert sorted(p for c in sync_engine.calls for p in c) == sorted(p for c in async_engine.calls for p in c)
    assert stats.requests == 55
    assert sorted(async_engine.calls[0]) == [
        (i, 0) for i in range(9)
    ]  # the first call waits for every rollout
    assert 0.0 <= stats.engine_idle_fraction < 1.0


def _flatten(x):
    if isinstance(x, list) and len(x) == 2 and all(isinstance(v, int) for v in x):
        return [x[0]]
    return [a for v in x for a in _flatten(v)] if isinstance(x, list) else []


def test_environment_steps_of_different_rollouts_overlap():
    # Four rollouts meet at a barrier inside their environment step: only a driver that runs their steps
    # at the same time gets past it (the synchronous one would wait for the timeout and fail).
    barrier = threading.Barrier(4, timeout=10)

    def prog(i):
        g = yield Generate([i], P)
        barrier.wait()
        return g.ids

    assert len(drive_async(SeedEcho(), [prog(i) for i in range(4)], threads=4)) == 4
    barrier = threading.Barrier(4, timeout=0.3)  # one program thread: the first rollout waits alone
    with pytest.raises(threading.BrokenBarrierError):
        drive_async(SeedEcho(), [prog(i) for i in range(4)], threads=1)


def test_one_rollout_runs_in_one_thread_at_a_time():
    # Subagents of one rollout share its bookkeeping: the driver must never resume two programs of the same
    # rollout at once, while programs of different rollouts do run side by side.
    active: dict[int, int] = {}
    peak = {"root": 0, "all": 0}
    lock = threading.Lock()

    def step(root):
        with lock:
            active[root] = active.get(root, 0) + 1
            peak["root"] = max(peak["root"], active[root])
            peak["all"] = max(peak["all"], sum(active.values()))
        time.sleep(0.005)
        with lock:
            active[root] -= 1

    def child(root, k):
        for turn in range(2):
            step(root)
            yield Generate([root, k, turn], Q)
        step(root)
        return k

    def prog(root):
        step(root)
        yield Generate([root], P)
        step(root)
        got = yield Spawn([child(root, k) for k in range(3)])
        step(root)
        return got

    assert drive_async(SeedEcho(delay=0.001), [prog(i) for i in range(4)], threads=8) == [[0, 1, 2]] * 4
    assert peak["root"] == 1 and peak["all"] > 1


def test_a_failing_stream_is_raised_and_its_threads_stop(model_tok):
    model, tok = model_tok

    class Failing(HFEngine):
        def open_stream(self):
            stream = super().open_stream()
            stream.step = lambda: (_ for _ in ()).throw(RuntimeError("decode step failed"))
            return stream

    def prog(i):
        return (yield Generate([5, 6, i], P)).ids

    with pytest.raises(RuntimeError, match="decode step failed"):
        drive_async(Failing(model, tok), [prog(i) for i in range(3)], threads=2)
    # the driver's program and engine threads have stopped (other tests' threads may come and go)
    assert not [
        t.name for t in threading.enumerate() if t.name.startswith(("horizonrl-program", "horizonrl-engine"))
    ]


def test_a_failing_program_or_engine_is_raised():
    def bad(i):
        yield Generate([i], P)
        if i == 2:
            raise KeyError("environment broke")
        return i

    with pytest.raises(KeyError, match="environment broke"):
        drive_async(SeedEcho(), [bad(i) for i in range(5)], threads=2)

    class Broken(SeedEcho):
        def generate(self, prompts, params, *, seeds=None):
            raise RuntimeError("engine died")

    with pytest.raises(RuntimeError, match="engine died"):
        drive_async(Broken(), [bad(i) for i in range(3)], threads=2)


def test_engines_without_request_seeds_run_the_sync_driver_and_the_config_says_so():
    class Plain(Engine):
        def __init__(self):
            self.calls = 0

        def generate(self, prompts, params):
            self.calls += 1
            return [Generation([1], [-0.5], "x", "stop") for _ in prompts]

        def score(self, contexts, continuations):  # pragma: no cover - unused
            raise NotImplementedError

    def prog(i):
        return (yield Generate([i], P)).ids

    eng = Plain()
    assert drive(eng, [prog(i) for i in range(3)], mode="async") == [[1]] * 3 and eng.calls == 1
    with pytest.raises(ValueError, match=r"path seeds need an engine with supports_seeds"):
        drive(eng, [prog(0)], mode="sync", path_seeds=True)
    cfg = load_config(None, ["rollout.driver=async"])
    with pytest.raises(ConfigError, match=r"rollout.driver='async'.*Plain"):
        check_driver(Plain(), cfg)
    with pytest.raises(ConfigError, match=r"rollout\.driver"):
        load_config(None, ["rollout.driver=eager"])


# --------------------------------------------------------------------------- the real agents


def _programs(renderer, *, agent, context, n, budget=1024, max_new=24, cparams=None, turns=4):
    cls = get_env("lookup")
    knobs = {"hops": 2, "obs_facts": 2}
    tasks = cls.make_tasks(n, seed=11, **knobs)
    spec = AgentSpec(
        renderer=renderer,
        params=SamplingParams(max_new_tokens=max_new),
        limits=LoopLimits(turns, budget),
        context=context,
        context_params=cparams or {},
        make_env=lambda: cls(**knobs),
    )
    return [
        make_program(agent, spec.make_env(), t, spec, uid=f"{j}", group_id=f"{j}")
        for j, t in enumerate(tasks)
    ]


def _turns(rollouts):
    return [
        [(s.kind, tuple(t.prompt_ids), tuple(t.response_ids)) for s in r.segments for t in s.turns]
        for r in rollouts
    ]


def test_tiny_model_rollouts_match_between_drivers(model_tok):
    # The same samples from batches of different shapes: the HF engine draws every token from its request's
    # seed, so only float rounding between batch shapes could move a token.
    model, tok = model_tok
    renderer = ChatRenderer(tok)
    runs = {}
    for mode in ("sync", "async"):
        engine = HFEngine(model, tok, seed=5)
        programs = _programs(renderer, agent="react", context="append", n=12)
        kw = {"path_seeds": True} if mode == "sync" else {}
        runs[mode] = drive(engine, programs, mode=mode, **kw)
    a, b = runs["sync"], runs["async"]
    assert _turns(a) == _turns(b)
    assert sum(len(t) for t in _turns(a)) >= 12
    for ra, rb in zip(a, b, strict=True):
        np.testing.assert_allclose(
            np.concatenate([t.logprobs for t in ra.turns]),
            np.concatenate([t.logprobs for t in rb.turns]),
            atol=1e-5,
        )
        assert ra.reward == rb.reward and ra.termination == rb.termination


class ScriptedPolicy(SeedEcho):
    """A scripted lookup agent: ``say(context, seed)`` is its reply, so every choice comes from the
    request's seed."""

    def __init__(self, tok, seed=0, delay=0.0):
        super().__init__(seed, delay)
        self.tok = tok

    def generate(self, prompts, params, *, seeds=None):
        out = []
        for p, s in zip(prompts, seeds, strict=True):
            text = self.say(self.tok.decode(p), s)
            ids = [*self.tok.encode(text, add_special_tokens=False), self.tok.eos_token_id]
            ids = ids[: params.max_new_tokens]
            out.append(
                Generation(ids, [-0.1] * len(ids), self.tok.decode(ids, skip_special_tokens=True), "stop")
            )
        time.sleep(self.delay)
        return out


class ForkPolicy(ScriptedPolicy):
    """Forks two subagents or answers at once; subagents and the reviewing turn answer."""

    def say(self, ctx, s):
        if "You are a research subagent" in ctx or "Subagent #1:" in ctx or s % 3 == 0:
            return format_answer(str(s % 11))
        tasks = [{"task": f"look up part {s % 7}"}, {"task": f"look up part {s % 5}"}]
        return format_tool_call("fork", {"subagents": tasks})


class SearchPolicy(ScriptedPolicy):
    """Searches, answers, and writes whatever a compaction or memory-selection session asks for."""

    def say(self, ctx, s):
        if "<session_history>" in ctx:
            return f"<summary>fact {s % 5}</summary>" if s % 4 else "no summary"
        if s % 9 == 0:
            return format_answer(str(s % 3))
        return format_tool_call("search", {"query": f"entity {s % 6}"})


@pytest.mark.parametrize(
    "context,cparams,kind",
    [("compaction", {"prompts": "short", "max_compactions": 2}, "compaction"), ("memory", {}, "selection")],
)
def test_multi_session_contexts_match_between_drivers(model_tok, context, cparams, kind):
    _, tok = model_tok
    renderer = ChatRenderer(tok)
    runs = {}
    for mode, delay in (("sync", 0.0), ("async", 0.002)):
        engine = SearchPolicy(tok, seed=4, delay=delay)
        programs = _programs(
            renderer, agent="react", context=context, n=6, max_new=80, budget=700, cparams=cparams, turns=20
        )
        kw = {"path_seeds": True} if mode == "sync" else {}
        runs[mode] = drive(engine, programs, mode=mode, **kw)
    assert _turns(runs["sync"]) == _turns(runs["async"])
    assert sum(s.kind == kind for r in runs["async"] for s in r.segments) >= 2


def test_fork_agent_subagents_match_between_drivers(model_tok):
    _, tok = model_tok
    renderer = ChatRenderer(tok)
    runs = {}
    for mode, delay in (("sync", 0.0), ("async", 0.003)):
        engine = ForkPolicy(tok, seed=2, delay=delay)
        programs = _programs(renderer, agent="fork", context="append", n=8, max_new=400, budget=8192)
        kw = {"path_seeds": True} if mode == "sync" else {}
        runs[mode] = drive(engine, programs, mode=mode, **kw)
    assert _turns(runs["sync"]) == _turns(runs["async"])
    assert sum(s.kind == "subagent" for r in runs["async"] for s in r.segments) >= 4


def _fit(model_dir, out):
    overrides = ("train.steps=2", "rollout.driver=async", "rollout.temperature=0.8", "rollout.env_threads=3")
    trainer = GroupTrainer(arith_run_config(model_dir, out, *overrides))
    assert trainer.spec.driver == DriverOptions(mode="async", threads=3)
    trainer.fit()
    trainer.close()
    return [
        {k: v for k, v in m.items() if not k.startswith(("time/", "throughput/"))} for m in read_metrics(out)
    ]


def test_training_with_the_async_driver_is_exact_and_reproducible(tiny_model_dir, tmp_path):
    first = _fit(tiny_model_dir, tmp_path / "a")
    for m in first[1:]:
        assert abs(m["train/ratio_geomean"] - 1.0) < 1e-3 and m["train/ratio_max_abs_log"] < 1e-3
        assert m["rollout/turns_mean"] > 0
    # Same seed, same threads: the same rollouts and rewards. The engine's log-probs (continuous batching:
    # a row's neighbours in the decode batch vary with timing) and what is computed from them agree to
    # float rounding, not bit for bit.
    second = _fit(tiny_model_dir, tmp_path / "b")
    exact = ("rollout/", "reward/", "budget/", "step")
    assert [{k: v for k, v in m.items() if k.startswith(exact)} for m in second] == [
        {k: v for k, v in m.items() if k.startswith(exact)} for m in first
    ]
    assert second == [pytest.approx(m, rel=1e-4, abs=1e-5) for m in first]
    assert all(m["throughput/prefix_cache_hit_rate"] > 0 for m in read_metrics(tmp_path / "a")[1:])
    # Prefix reuse, checked from the rollouts: a turn prefilled only what it added to the previous turn of
    # its rollout (the common prefix with that turn's prompt + response, all but the last token of each).
    turns = 0
    for r in read_jsonl(tmp_path / "a" / "rollouts" / "step_1.jsonl"):
        prev = None
        for t in r.turns:
            want = 0
            if prev is not None:
                done = np.asarray(prev.prompt_ids + prev.response_ids[:-1])
                want = min(common_prefix(done, np.asarray(t.prompt_ids)), len(t.prompt_ids) - 1)
            assert t.info["cached_tokens"] == want
            turns += prev is not None and want > 0
            prev = t
    assert turns > 0


def test_rtpo_trunks_and_siblings_under_the_async_driver(tiny_model_dir, tmp_path):
    trainer = RTPOTrainer(rtpo_run_config(tiny_model_dir, tmp_path / "r", "rollout.driver=async"))
    assert trainer.spec.driver.mode == "async"
    trainer.fit()
    trainer.close()
    records = read_metrics(tmp_path / "r")
    trunks = list(read_jsonl(tmp_path / "r" / "rollouts" / "trunks_0.jsonl"))
    assert records[-1]["budget/rollouts"] == len(trunks) + 2 * sum(
        len(agent_turns(r)) for r in trunks
    )  # siblings=3: trunk + 2
    for m in records[1:]:
        assert abs(m["train/ratio_geomean"] - 1.0) < 1e-3


@pytest.mark.parametrize("lean", [False, True])
def test_hf_stream_gives_each_request_what_generate_gives_it(model_tok, lean):
    # Requests join a running batch at different steps, in two lanes (params), with stop strings, top
    # log-probs and different lengths; each must get the tokens and log-probs generate() gives its seed.
    # With the lean decode step too (its rows join with padding between kept and new columns).
    model, tok = model_tok
    engine = HFEngine(model, tok, max_batch_size=5, lean_decode=lean)  # over capacity: 7 requests at once
    assert (engine._lean is not None) == lean
    lanes = [
        SamplingParams(max_new_tokens=12, temperature=0.7, top_logprobs=2),
        SamplingParams(max_new_tokens=7, top_p=0.9, stop=("a",)),
    ]
    rng = np.random.default_rng(0)
    requests = [
        (k, [int(x) for x in rng.integers(5, 300, size=int(rng.integers(3, 30)))], lanes[k % 2], 1000 + k)
        for k in range(14)
    ]
    stream = engine.open_stream()
    for k in range(7):
        stream.add(*requests[k])
    got, steps, k = {}, 0, 7
    while k < len(requests) or stream.pending:
        for _ in range(int(rng.integers(0, 3))):  # 0-2 new requests before each step
            if k < len(requests):
                stream.add(*requests[k])
                k += 1
        got.update(stream.step())
        assert all(len(lane.rows) <= 5 for lane in stream.lanes.values())
        steps += 1
    assert sorted(got) == list(range(14)) and steps > 12
    for key, prompt, params, seed in requests:
        (want,) = engine.generate([prompt], params, seeds=[seed])
        g = got[key]
        assert g.ids == want.ids and g.finish_reason == want.finish_reason and g.text == want.text
        np.testing.assert_allclose(g.logprobs, want.logprobs, atol=1e-5)
        if params.top_logprobs:
            assert [[t for t, _ in s] for s in g.meta["top_logprobs"]] == [
                [t for t, _ in s] for s in want.meta["top_logprobs"]
            ]
    assert any(g.finish_reason == "stop" for g in got.values()) and any(
        len(g.ids) == 12 for g in got.values()
    )


def test_the_token_budget_holds_under_a_stream(model_tok):
    # A limit smaller than the requests' worst case: every request joins clipped to what the running ones
    # leave, the ones that find nothing left end empty at once, and spent never passes the limit.
    model, tok = model_tok
    budget = TokenBudget(limit=50)
    engine = BudgetedEngine(HFEngine(model, tok), budget)
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)

    def prog(i):
        out = []
        for turn in range(3):
            out.append(len((yield Generate([5 + i, 6 + turn], params)).ids))
        return out

    got = drive_async(engine, [prog(i) for i in range(4)], threads=2)
    assert budget.clipped and budget.spent == sum(map(sum, got)) <= 50
    assert budget.spent == 50 and engine._reserved == 0  # ignore_eos: every clipped request used its share
    assert sorted(n for r in got for n in r)[:3] == [0, 0, 0]


def test_async_driver_composes_with_bounded_staleness(tiny_model_dir, tmp_path):
    extra = ("train.steps=3", "train.max_staleness=1", "rollout.driver=async")
    trainer = GroupTrainer(arith_run_config(tiny_model_dir, tmp_path / "s", *extra))
    records = trainer.fit()
    trainer.close()
    assert [r["async/policy_version"] for r in records[1:]] == [0.0, 0.0, 1.0]
    assert all(r["rollout/turns_mean"] > 0 for r in records[1:])


def test_prefix_reuse_gives_the_same_generations_and_skips_the_prefill(model_tok):
    # Three groups of G=3 identical prompts (nine lineages), then each sample's next turn (prompt +
    # generation + a 4-token observation) in its lineage, then a sibling that forks lineage 0 after three
    # generated tokens. Every generation must equal generate() with its seed; the later turns prefill
    # only what they add to their lineage's cache.
    model, tok = model_tok
    engine = HFEngine(model, tok)
    params = SamplingParams(max_new_tokens=8, temperature=0.9)
    rng = np.random.default_rng(4)
    groups = [[int(x) for x in rng.integers(5, 300, size=20)] for _ in range(3)]
    stream = engine.open_stream()
    assert stream.store is not None

    def run(requests):
        for key, prompt, seed, lineage in requests:
            stream.add(key, prompt, params, seed, lineage)
        out = {}
        while stream.pending:
            out.update(stream.step())
        return out

    first = [(f"{g}-{k}", p, 10 * g + k, 3 * g + k) for g, p in enumerate(groups) for k in range(3)]
    got = run(first)
    obs = [7, 8, 9, 10]
    second = [(f"{key}+", p + got[key].ids + obs, seed + 100, lin) for key, p, seed, lin in first]
    got.update(run(second))
    key0, p0, _, _ = first[0]
    sibling = [("sib", p0 + got[key0].ids[:3], 999, 0)]  # lineage 0's kept cache: its second turn
    got.update(run(sibling))
    other = [("other", p0 + got[key0].ids[:3], 998, "new")]  # a new lineage reuses nothing
    got.update(run(other))
    for key, prompt, seed, _ in first + second + sibling + other:
        (want,) = engine.generate([prompt], params, seeds=[seed])
        assert got[key].ids == want.ids, key
        np.testing.assert_allclose(got[key].logprobs, want.logprobs, atol=1e-5)
    cached = {key: got[key].meta["cached_tokens"] for key in got}
    assert [cached[key] for key, *_ in first] == [0] * 9 and cached["other"] == 0
    for key, p, _, _ in first:  # the whole previous turn except its last token came from the cache
        assert cached[f"{key}+"] == len(p) + len(got[key].ids) - 1
    assert cached["sib"] == len(p0) + 3 - 1  # the common prefix, but not the last prompt token
    stream.forget(0)
    stream.step()
    assert 0 not in stream.store.entries and len(stream.store.entries) == 9  # lineages 1-8 and "new"
    assert HFEngine(model, tok, prefix_reuse=False).open_stream().store is None


def test_prefix_store_keeps_one_cache_per_lineage():
    from horizonrl.inference.prefix_store import PrefixStore

    kv = [(torch.zeros(2, 5, 4), torch.zeros(2, 5, 4))]
    assert common_prefix(np.array([1, 2, 3]), np.array([1, 2, 4])) == 2
    assert common_prefix(np.array([1, 2]), np.array([1, 2, 5])) == 2
    assert common_prefix(np.array([], dtype=np.int64), np.array([1])) == 0
    store = PrefixStore()
    store.put("a", [1, 2, 3], kv)
    store.put("a", [1, 2, 3, 4, 5], kv)  # replaces lineage a's cache
    assert store.nbytes == 2 * 2 * 5 * 4 * 4
    entry, m = store.match("a", [1, 2, 3, 9])
    assert m == 3 and list(entry.ids) == [1, 2, 3, 4, 5]
    assert store.entries == {}  # taken by its request, whose own cache replaces it when it ends
    store.put("a", [1, 2, 3, 4, 5], kv)
    assert store.match("a", [1, 2, 3, 4, 5])[1] == 4  # the last prompt token is always prefilled
    store.put("a", [1, 2, 3, 4, 5], kv)
    assert store.match("a", [8, 9]) == (None, 0) and store.match("b", [1, 2, 3, 9]) == (None, 0)
    store.put("a", [1, 2, 3], kv)
    store.forget("a")
    assert store.entries == {}


def test_ray_stream_gives_free_replicas_what_waits_and_keeps_busy_ones_to_one_call():
    # Pure bookkeeping of RayStream (no Ray): replica 0 is busy with a call, so requests that the router
    # sends there go to the free replica 1 instead of queueing behind it; once both are busy, requests
    # wait; a closed stream releases what it held. (The Ray run itself: tests/scale/test_ray_workers.py.)
    from horizonrl.inference.ray_engine import RayStream
    from horizonrl.inference.routing import PrefixRouter

    calls = []

    class Replica:
        def __init__(self, r):
            self.generate = types.SimpleNamespace(
                remote=lambda prompts, params, seeds, r=r: calls.append(r) or object()
            )

    engine = types.SimpleNamespace(replicas=[Replica(0), Replica(1)], router=PrefixRouter(2))
    stream = RayStream(engine)
    stream._waiting = [("a", [1, 2, 3], P, 1, None)]
    stream._dispatch()
    assert calls == [0] and not stream._waiting  # both free: the router's choice
    stream._waiting = [("b", [4, 5, 6], P, 2, None), ("c", [7, 8, 9], P, 3, None)]
    stream._dispatch()  # replica 0 busy: one request goes to replica 1, the other waits
    assert calls == [0, 1] and len(stream._waiting) == 1 and stream._waiting[0][0] in ("b", "c")
    stream._dispatch()
    assert calls == [0, 1] and len(stream._calls) == 2  # nothing free: nothing sent
    stream._take = lambda: []
    stream._calls = {}
    stream.close()
    assert stream._waiting == [] and not stream.pending


def test_a_closed_budget_stream_releases_what_it_reserved(model_tok):
    model, tok = model_tok
    engine = BudgetedEngine(HFEngine(model, tok), TokenBudget(limit=100))
    stream = engine.open_stream()
    stream.add("k", [5, 6, 7], SamplingParams(max_new_tokens=20, ignore_eos=True), 1)
    stream.step()  # joined and running: 20 tokens reserved
    assert engine._reserved == 20
    stream.close()
    assert engine._reserved == 0 and not stream.pending
