"""Fast checks of the scale-out pieces that need no Ray or torchrun (default suite).

Request seeding (samples independent of batch and order), the prefix router, threaded program
advancement in the driver, the distributed config, and the sharded micro-batch plan.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from horizonrl.agents.driver import DriverOptions, Generate, Spawn, drive
from horizonrl.config import ConfigError, load_config
from horizonrl.inference import HFEngine, SamplingParams
from horizonrl.inference.base import Engine, Generation
from horizonrl.inference.routing import PrefixRouter, block_hashes
from horizonrl.inference.seeding import RequestSeeds, SeededEngine, request_uniforms
from horizonrl.models import load_model_and_tokenizer
from horizonrl.train.update.chunks import rank_chunks


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    return HFEngine(model.eval(), tok, max_batch_size=4)


def _splitmix_reference(seed: int, step: int) -> float:
    """SplitMix64 written with Python integers (the spec of request_uniforms)."""
    mask = (1 << 64) - 1
    x = (seed + (step + 1) * 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    x ^= x >> 31
    return (x >> 11) / 2**53


def test_request_uniforms_match_a_python_splitmix64():
    seeds = [0, 1, 12345, 2**62 + 7, 2**63 - 2]
    for step in (0, 1, 17):
        got = request_uniforms(seeds, step)
        want = [_splitmix_reference(s, step) for s in seeds]
        assert got.tolist() == want
    u = request_uniforms(np.arange(20000), 3)
    assert u.min() >= 0.0 and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.01


def test_request_seeds_do_not_depend_on_batch_or_order(engine):
    prompts = [[5, 6, 7][: 1 + k % 3] * (1 + k) for k in range(7)]
    seeds = [101 * (k + 1) for k in range(7)]
    for top_p in (1.0, 0.8):
        params = SamplingParams(max_new_tokens=10, top_p=top_p, temperature=0.9)
        full = engine.generate(prompts, params, seeds=seeds)
        part = engine.generate(prompts[2:5], params, seeds=seeds[2:5])
        rev = engine.generate(prompts[::-1], params, seeds=seeds[::-1])[::-1]
        for a, b in zip(full[2:5], part, strict=True):
            assert a.ids == b.ids
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
        assert [g.ids for g in full] == [g.ids for g in rev]
    # Different seeds give different samples (the seeds are used).
    other = engine.generate(prompts, SamplingParams(max_new_tokens=10), seeds=[s + 1 for s in seeds])
    assert [g.ids for g in other] != [
        g.ids for g in engine.generate(prompts, SamplingParams(max_new_tokens=10), seeds=seeds)
    ]


def test_batch_seeding_is_unchanged_without_seeds(engine):
    """No seeds: the engine generator is used exactly as before (same draws as torch.rand)."""
    prompts = [[5, 6, 7, 8]] * 3
    engine.set_seed(7)
    a = engine.generate(prompts, SamplingParams(max_new_tokens=6))
    engine.set_seed(7)
    b = engine.generate(prompts, SamplingParams(max_new_tokens=6))
    assert [g.ids for g in a] == [g.ids for g in b]


def test_seeded_engine_checkpoints_its_seed_stream(engine):
    se = SeededEngine(engine, seed=3)
    state = se.rng_state()
    a = se.generate([[5, 6, 7]] * 2, SamplingParams(max_new_tokens=5))
    se.set_rng_state(state)
    b = se.generate([[5, 6, 7]] * 2, SamplingParams(max_new_tokens=5))
    assert [g.ids for g in a] == [g.ids for g in b]
    s1, s2 = RequestSeeds(3).draw(4), RequestSeeds(3).draw(4)
    assert s1 == s2 and len(set(s1)) == 4


def test_block_hashes_chain_full_blocks_only():
    assert block_hashes([1, 2, 3], 4) == []
    h = block_hashes(list(range(10)), 4)
    assert len(h) == 2
    assert block_hashes([*range(8), 99, 98], 4) == h  # the partial tail is not hashed
    assert block_hashes([0, 1, 2, 3, 9, 9, 9, 9], 4)[0] == h[0]
    assert block_hashes([0, 1, 2, 3, 9, 9, 9, 9], 4)[1] != h[1]


def test_router_keeps_rollouts_and_siblings_on_their_replica_within_the_bound():
    r = PrefixRouter(2, block=4, max_imbalance=0.0)
    system = list(range(100, 116))  # shared by every prompt
    tasks = [system + [t] * 8 for t in range(4)]
    first = r.assign(tasks)
    assert sorted(first) == [0, 0, 1, 1]
    # Turn 2 of each rollout extends its own prompt + response: it follows its first turn.
    responses = [[50 + t] * 8 for t in range(4)]
    for rep, p, resp in zip(first, tasks, responses, strict=True):
        r.record(rep, p + resp)
    second = r.assign([p + resp + [7] * 4 for p, resp in zip(tasks, responses, strict=True)])
    assert second == first
    # RTPO: two siblings forked at each boundary c_k (the turn-2 prompt) go where the trunk sampled it.
    boundaries = [p + resp + [7] * 4 for p, resp in zip(tasks, responses, strict=True)]
    sibs = r.assign([b for b in boundaries for _ in range(2)])
    assert sibs == [rep for rep in first for _ in range(2)]
    # The bound: 8 prompts, all preferring replica 0, split 4/4 with no slack.
    crowd = r.assign([boundaries[first.index(0)]] * 8)
    assert crowd.count(0) == 4 and crowd.count(1) == 4
    assert 0 < r.hit_rate() <= 1
    assert PrefixRouter(3, mode="round_robin").assign([[1]] * 5) == [0, 1, 2, 0, 1]


class _EchoEngine(Engine):
    """A scripted engine: the generation is the prompt length; records every call."""

    def __init__(self):
        self.calls: list[list[list[int]]] = []

    def generate(self, prompts, params):
        self.calls.append([list(p) for p in prompts])
        return [
            Generation(ids=[len(p)], logprobs=[0.0], text=str(len(p)), finish_reason="stop") for p in prompts
        ]

    def score(self, contexts, continuations):
        raise NotImplementedError


def _programs(log):
    def child(i, j):
        g = yield Generate([i, j, 0], SamplingParams(max_new_tokens=1))
        log.append(("child", i, j))
        return g.ids[0]

    def root(i):
        total = 0
        for turn in range(1 + i % 3):
            g = yield Generate([i] * (turn + 2), SamplingParams(max_new_tokens=1))
            total += g.ids[0]
            if i % 2 and turn == 0:
                total += sum((yield Spawn([child(i, j) for j in range(2)])))
        return total

    return [root(i) for i in range(6)]


def test_threaded_advancement_gives_the_same_batches_and_results():
    serial, threaded = _EchoEngine(), _EchoEngine()
    a = drive(serial, _programs([]), DriverOptions(threads=1))
    b = drive(threaded, _programs([]), DriverOptions(threads=4))
    assert a == b
    assert serial.calls == threaded.calls


def test_threaded_advancement_reraises_program_errors():
    def bad():
        yield Generate([1], SamplingParams(max_new_tokens=1))
        raise RuntimeError("boom")

    def good():
        yield Generate([2], SamplingParams(max_new_tokens=1))
        return 1

    with pytest.raises(RuntimeError, match=r"boom"):
        drive(_EchoEngine(), [good(), bad(), good()], DriverOptions(threads=3))


def test_distributed_config_validation():
    cfg = load_config(None, ["distributed.backend=ray", "distributed.num_engine_replicas=2"])
    assert cfg.distributed.request_seeding() and not load_config(None, []).distributed.request_seeding()
    assert load_config(None, []).distributed.request_seeding(world_size=2)
    with pytest.raises(ConfigError, match=r"num_engine_replicas=2.*backend=ray"):
        load_config(None, ["distributed.num_engine_replicas=2"])
    with pytest.raises(ConfigError, match=r"distributed.address"):
        load_config(None, ["distributed.address=auto"])
    with pytest.raises(ConfigError, match=r"seeding='batch'"):
        load_config(None, ["distributed.backend=ray", "distributed.seeding=batch"])
    with pytest.raises(ConfigError, match=r"distributed.update='zero'"):
        load_config(None, ["distributed.update=zero"])
    with pytest.raises(ConfigError, match=r"train.max_staleness=-1"):
        load_config(None, ["train.max_staleness=-1"])


class _FakeWorld:
    def __init__(self, rank, size, peers):
        self.rank, self.size, self.peers = rank, size, peers

    def my_positions(self, n):
        return list(range(self.rank, n, self.size))

    def max(self, values):
        return [max(values[0], *self.peers)]


def test_rank_chunks_cover_every_row_once_and_line_up_across_ranks():
    lengths = sorted([30, 30, 40, 50, 60, 60, 70, 90, 200])
    plans = [rank_chunks(lengths, 120, _FakeWorld(r, 2, [3, 4])) for r in range(2)]
    assert len(plans[0]) == len(plans[1]) == 4  # padded to the largest rank's count
    seen = sorted(p for plan in plans for chunk in plan if chunk for p in chunk)
    assert seen == list(range(len(lengths)))
    # One process: exactly the single-process micro-batches (greedy, by padded tokens).
    assert rank_chunks(lengths, 120, None) == [[0, 1, 2], [3, 4], [5], [6], [7], [8]]


def test_hf_engine_rejects_a_wrong_number_of_seeds(engine):
    with pytest.raises(ValueError, match=r"2 seeds for 3 prompts"):
        engine.generate([[5], [6], [7]], SamplingParams(max_new_tokens=2), seeds=[1, 2])


def test_request_seeding_leaves_greedy_decoding_alone(engine):
    p = SamplingParams(max_new_tokens=5, greedy=True)
    a = engine.generate([[5, 6, 7]], p, seeds=[1])
    b = engine.generate([[5, 6, 7]], p, seeds=[2])
    assert a[0].ids == b[0].ids
    assert torch.tensor(a[0].logprobs).le(0).all()


def test_orphaned_shm_reports_unused_segments_only(tmp_path):
    import os
    from pathlib import Path

    from horizonrl import cluster

    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm")
    free, held = f"hrl_test_{os.getpid()}_free", f"hrl_test_{os.getpid()}_held"
    Path("/dev/shm", free).write_bytes(b"x")
    try:
        with open(Path("/dev/shm", held), "wb"):
            assert cluster.orphaned_shm({free, held, "hrl_test_missing"}) == {free}
    finally:
        Path("/dev/shm", free).unlink()
        Path("/dev/shm", held).unlink(missing_ok=True)
