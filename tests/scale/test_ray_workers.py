"""Ray rollout workers on a private local Ray (2 CPUs, loopback only): marker ``distributed``.

Two HF-engine replicas give the same groups and the same update as one local engine with request
seeding; environments in worker actors behave like local ones; nothing listens outside 127.0.0.1;
actors and shared memory are released. The vLLM-replica variant runs where
``horizonrl.inference.vllm_engine`` imports (the vllm-cpu target).
"""

from __future__ import annotations

import importlib.util
import os
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")

from helpers import shaped_env  # noqa: E402  (registers arith_shaped)
from helpers.shaped_env import small_run_config  # noqa: E402
from horizonrl import cluster  # noqa: E402
from horizonrl.agents.driver import DriverOptions  # noqa: E402
from horizonrl.config import load_config  # noqa: E402
from horizonrl.credit import flatten_rollouts  # noqa: E402
from horizonrl.train.trainers.group import GroupTrainer  # noqa: E402

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def ray_session():
    """One private Ray for the module; on teardown: Ray down and /dev/shm as before."""
    before = cluster.shm_files()
    r = cluster.connect(None, num_cpus=2)
    ray.cloudpickle.register_pickle_by_value(shaped_env)  # the test env reaches the workers by value
    yield r
    cluster.release()
    assert not ray.is_initialized()
    leaked = cluster.orphaned_shm(cluster.shm_files() - before)
    if leaked:  # give late unlinks a moment
        time.sleep(3)
        leaked = cluster.orphaned_shm(leaked)
    assert not leaked, f"shared memory left behind: {sorted(leaked)}"


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _listening_addresses(pids: list[int]) -> list[str]:
    """Local addresses (hex, as in /proc/net/tcp*) of the TCP sockets these processes listen on."""
    inodes = set()
    for p in pids:
        try:
            fds = os.listdir(f"/proc/{p}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{p}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # 0A: LISTEN
                out.append(f[1].split(":")[0])
    return out


def test_ray_listens_on_loopback_only(ray_session):
    assert ray.util.get_node_ip_address() == "127.0.0.1"
    assert [n["NodeManagerAddress"] for n in ray.nodes()] == ["127.0.0.1"]
    addrs = _listening_addresses(_descendants(os.getpid()))
    assert addrs, "expected Ray's servers among this process's descendants"
    loopback = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}
    assert set(addrs) <= loopback, addrs


def _turns(groups):
    return [t for r in flatten_rollouts(groups) for t in r.turns]


def _run(cfg, steps=2):
    tr = GroupTrainer(cfg)
    groups_per_step = []
    collect = tr.collect

    def recording(tasks):
        groups = collect(tasks)
        groups_per_step.append(groups)
        return groups

    tr.collect = recording
    records = [tr.train_step() for _ in range(steps)]
    return tr, groups_per_step, records


def _assert_same_runs(a, b, init, *, logprob_rtol=1e-4, weight_frac=1e-2):
    """Same tokens, rewards and losses; log-probs and weights equal up to float32 rounding.

    A replica pads and batches only its share of the requests, so its matmuls sum in another order than
    the local engine's: log-probs agree to a relative 4e-6 (measured; a wrong weight version or
    position would move them by far more than the 1e-4 allowed). Adam's per-parameter normalisation
    scales that rounding up where a gradient is near zero (measured: 1.6e-5 after two steps that moved a
    weight by 0.02), so weights agree to 1 % of the largest update, as in the torchrun tests.
    """
    (ta, ga, ra), (tb, gb, rb) = a, b
    for step_a, step_b in zip(ga, gb, strict=True):
        turns_a, turns_b = _turns(step_a), _turns(step_b)
        assert [t.prompt_ids for t in turns_a] == [t.prompt_ids for t in turns_b]
        assert [t.response_ids for t in turns_a] == [t.response_ids for t in turns_b]
        for x, y in zip(turns_a, turns_b, strict=True):
            np.testing.assert_allclose(x.logprobs, y.logprobs, rtol=logprob_rtol, atol=1e-6)
        assert [r.reward for r in flatten_rollouts(step_a)] == [r.reward for r in flatten_rollouts(step_b)]
    for ma, mb in zip(ra, rb, strict=True):
        assert ma["train/pg_loss"] == pytest.approx(mb["train/pg_loss"], abs=1e-6)
        assert ma["train/grad_norm"] == pytest.approx(mb["train/grad_norm"], rel=1e-4)
    if init is None:  # a LoRA policy: its B matrices start at zero
        moved = max(float(p.detach().abs().max()) for n, p in ta.model.named_parameters() if ".lora_B." in n)
    else:
        moved = max(
            float((p.detach() - q).abs().max()) for p, q in zip(ta.model.parameters(), init, strict=True)
        )
    assert moved > 1e-3, "the update did not move the weights: the comparison would be vacuous"
    for (name, p), q in zip(ta.model.named_parameters(), tb.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=weight_frac * moved, rtol=0, msg=name)


def _assert_same_scores(engine, local) -> None:
    """``engine`` (the replicas) scores continuations as the local engine does (float32 rounding)."""
    ctx, cont = [[5, 6, 7, 8, 9]] * 3, [[10, 11], [12], [13, 14, 15]]
    for x, y in zip(engine.score(ctx, cont), local.score(ctx, cont), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)


def test_two_hf_replicas_match_one_local_engine(ray_session, tiny_model_dir, tmp_path):
    local = small_run_config(tiny_model_dir, tmp_path / "local", "distributed.seeding=request")
    remote = small_run_config(
        tiny_model_dir, tmp_path / "ray", "distributed.backend=ray", "distributed.num_engine_replicas=2"
    )
    from horizonrl.models import load_model_and_tokenizer

    init = [p.detach().clone() for p in load_model_and_tokenizer(tiny_model_dir)[0].parameters()]
    a = _run(local)
    b = _run(remote)
    try:
        eng = b[0].engine
        info = eng.info()
        assert len({i["pid"] for i in info}) == 2 and all(i["node_ip"] == "127.0.0.1" for i in info)
        assert [i["version"] for i in info] == [2, 2]  # one weight sync per update
        served = {g.meta["replica"] for g in eng.generate([[5, 6, 7, 8]] * 6, a[0].params)}
        assert served == {0, 1}
        _assert_same_runs(a, b, init)
        _assert_same_scores(eng, a[0].engine)  # the replicas hold the updated weights
        replicas = list(eng.replicas)
    finally:
        b[0].close()
    # The actors are gone. ray.kill is asynchronous: a call sent right after it may still be served,
    # so poll until the actor answers with RayActorError (it must within the deadline).
    deadline = time.monotonic() + 60
    for r in replicas:
        while True:
            try:
                ray.get(r.info.remote(), timeout=30)
            except ray.exceptions.RayActorError:
                break
            assert time.monotonic() < deadline, "a replica still answers 60 s after close()"
            time.sleep(0.2)


def test_lora_policy_on_two_hf_replicas_matches_one_local_engine(ray_session, tiny_model_dir, tmp_path):
    """A LoRA policy: each replica carries the same adapters and loads the synced ones, so a Ray run
    samples, scores and trains as a local one."""
    lora = ("model.lora_r=4", "model.lora_alpha=8", "optim.lr=5e-3")
    local = small_run_config(tiny_model_dir, tmp_path / "local", "distributed.seeding=request", *lora)
    remote = small_run_config(
        tiny_model_dir,
        tmp_path / "ray",
        "distributed.backend=ray",
        "distributed.num_engine_replicas=2",
        *lora,
    )
    a = _run(local)
    b = _run(remote)
    try:
        _assert_same_runs(a, b, None)
        _assert_same_scores(b[0].engine, a[0].engine)
    finally:
        b[0].close()


def test_environment_workers_behave_like_local_environments(ray_session, tiny_model_dir, tmp_path):
    from horizonrl.envs.core.remote import EnvPool

    settings = load_config(None, ["distributed.backend=ray", "distributed.num_env_workers=2"]).distributed
    knobs = {"n_ops": 1, "max_operand": 9}
    pool = EnvPool(shaped_env.ShapedArithmeticEnv, knobs, workers=2, settings=settings)
    try:
        local = shaped_env.ShapedArithmeticEnv(**knobs)
        task = local.tasks(1, seed=3)[0]
        envs = [pool.make() for _ in range(3)]
        assert pool.live == [2, 1]
        remote = envs[0]
        assert remote.reset(task) == local.reset(task)
        assert [t.name for t in remote.tools] == [t.name for t in local.tools]
        assert remote.system_prompt == local.system_prompt and remote.can_fork
        snap = remote.snapshot()
        r1, l1 = remote.step("<answer>4</answer>"), local.step("<answer>4</answer>")
        assert (r1.observation, r1.reward, r1.done) == (l1.observation, l1.reward, l1.done)
        remote.restore(snap)
        local.reset(task)
        rng_r, rng_l = random.Random(5), random.Random(5)
        assert remote.expert_action(rng_r, 0.5) == local.expert_action(rng_l, 0.5)
        assert rng_r.getstate() == rng_l.getstate()  # the caller's generator advanced as in-process
        assert remote.state == local.state  # other attributes are read from the remote object
        with pytest.raises(AttributeError):
            _ = remote.no_such_attribute
        for e in envs:
            e.close()
        assert pool.live == [0, 0]
    finally:
        pool.close()


def test_a_run_with_environment_workers_matches_a_local_run(ray_session, tiny_model_dir, tmp_path):
    extra = ("train.steps=1",)
    local = _run(
        small_run_config(tiny_model_dir, tmp_path / "l", "distributed.seeding=request", *extra), steps=1
    )
    remote = _run(
        small_run_config(
            tiny_model_dir,
            tmp_path / "r",
            "distributed.backend=ray",
            "distributed.num_env_workers=2",
            "distributed.env_actors=all",
            *extra,
        ),
        steps=1,
    )
    try:
        assert remote[0].env_pool is not None and remote[0].spec.driver.threads == 2
        turns_l, turns_r = _turns(local[1][0]), _turns(remote[1][0])
        assert [t.response_ids for t in turns_l] == [t.response_ids for t in turns_r]
        assert [t.observation for t in turns_l] == [t.observation for t in turns_r]
        assert [t.reward for t in turns_l] == [t.reward for t in turns_r]
    finally:
        remote[0].close()


def test_async_driver_on_ray_workers_matches_a_local_async_run(ray_session, tiny_model_dir, tmp_path):
    # The asynchronous driver over two Ray replicas (a stream across replicas, whole calls on each) and
    # environment workers samples every request from its path seed, so it gives the local run's turns
    # (where the HF engine streams).
    extra = ("train.steps=1", "rollout.driver=async", "distributed.seeding=request")
    local = _run(small_run_config(tiny_model_dir, tmp_path / "l", *extra), steps=1)
    remote = _run(
        small_run_config(
            tiny_model_dir,
            tmp_path / "r",
            "distributed.backend=ray",
            "distributed.num_engine_replicas=2",
            "distributed.num_env_workers=2",
            "distributed.env_actors=all",
            *extra,
        ),
        steps=1,
    )
    try:
        assert remote[0].spec.driver == DriverOptions(mode="async", threads=8)
        assert type(remote[0].engine.open_stream()).__name__ == "RayStream"  # replicas as one stream
        turns_l, turns_r = _turns(local[1][0]), _turns(remote[1][0])
        assert len(turns_l) >= 8
        assert [t.response_ids for t in turns_l] == [t.response_ids for t in turns_r]
        assert [t.reward for t in turns_l] == [t.reward for t in turns_r]
    finally:
        remote[0].close()
        local[0].close()


def test_rtpo_siblings_on_two_replicas_match_a_local_engine(ray_session, tiny_model_dir, tmp_path):
    from horizonrl.train.methods.rtpo import RTPOTrainer

    common = (
        "train.trainer=rtpo",
        "env.name=arithmetic",
        "train.steps=1",
        "train.trainer_params.sync_every=2",  # a separate engine copy: weights pushed with sync(state_dict)
    )
    runs = []
    for name, extra in (
        ("local", ("distributed.seeding=request",)),
        (
            "ray",
            ("distributed.backend=ray", "distributed.num_engine_replicas=2", "distributed.prefix_block=8"),
        ),
    ):
        tr = RTPOTrainer(small_run_config(tiny_model_dir, tmp_path / name, *common, *extra))
        recorded = []
        run_programs = tr.run_programs

        def recording(made, kind="stage", run_programs=run_programs, recorded=recorded):
            out = run_programs(made, kind)
            recorded.append((kind, out))
            return out

        tr.run_programs = recording
        tr.fit()
        tr.close()
        runs.append((tr, recorded))
    (local, rec_l), (remote, rec_r) = runs
    assert [k for k, _ in rec_l] == [k for k, _ in rec_r] and len(rec_l) >= 2  # phase 1 and stages
    for (_, a), (_, b) in zip(rec_l, rec_r, strict=True):
        assert [t.response_ids for r in a for t in r.turns] == [t.response_ids for r in b for t in r.turns]
    for p, q in zip(local.model.parameters(), remote.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=0)
    # Siblings continue their trunk's boundary context: the router found it on the replica it chose.
    assert remote.engine.router.hit_rate() > 0.5


def test_async_rollouts_on_ray_replicas(ray_session, tiny_model_dir, tmp_path):
    cfg = small_run_config(
        tiny_model_dir,
        tmp_path / "async",
        "distributed.backend=ray",
        "distributed.engine_cpus=0.5",  # the collector's replica and the evaluation replica share 1 CPU
        "train.max_staleness=1",
        "train.steps=2",
    )
    tr = GroupTrainer(cfg)
    records = tr.fit()
    tr.close()  # both engines: the collector's and the trainer's
    assert [r["async/staleness_max"] for r in records] == [0.0, 1.0]
    assert tr.async_rollouts.engine.closed and tr.engine.closed


def test_engine_errors_surface_and_release_ray(ray_session, tiny_model_dir, tmp_path):
    cfg = small_run_config(
        tiny_model_dir, tmp_path / "bad", "distributed.backend=ray", "inference.params={nope: 1}"
    )
    with pytest.raises(Exception, match="nope"):
        GroupTrainer(cfg)
    big = small_run_config(
        tiny_model_dir,
        tmp_path / "big",
        "distributed.backend=ray",
        "distributed.num_engine_replicas=2",
        "distributed.engine_cpus=2",
    )
    with pytest.raises(ValueError, match=r"engine_cpus=2.0 x num_engine_replicas=2 needs 4 CPUs"):
        GroupTrainer(big)  # refused at once instead of waiting forever for CPUs
    assert ray.is_initialized()  # the module's session is still up (only this trainer's share was released)


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="the vLLM-replica variant runs in the vllm-cpu target"
)
def test_two_vllm_replicas_match_one_local_vllm_engine(ray_session, tmp_path):
    pytest.importorskip("horizonrl.inference.vllm_engine")
    from horizonrl.config import ModelConfig
    from horizonrl.train.warmstart.bootstrap import build_tiny

    model_dir = tmp_path / "vtiny"  # vLLM's CPU kernels want a head size of at least 32
    build_tiny(ModelConfig(tiny_hidden=128, tiny_layers=2, tiny_vocab=400, tiny_pretrain_steps=20), model_dir)
    common = ("inference.engine=vllm", "train.steps=1")
    local = small_run_config(model_dir, tmp_path / "vl", "distributed.seeding=request", *common)
    remote = small_run_config(
        model_dir,
        tmp_path / "vr",
        "distributed.backend=ray",
        "distributed.num_engine_replicas=2",
        "distributed.engine_cpus=0",  # vLLM runs its own processes
        *common,
    )
    a = _run(local, steps=1)
    a[0].close()  # one vLLM engine at a time on this machine
    b = _run(remote, steps=1)
    try:
        assert {g.meta["replica"] for g in b[0].engine.generate([[5, 6, 7, 8]] * 4, a[0].params)} == {0, 1}
        turns_a, turns_b = _turns(a[1][0]), _turns(b[1][0])
        assert [t.response_ids for t in turns_a] == [t.response_ids for t in turns_b]
        for x, y in zip(turns_a, turns_b, strict=True):
            np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-4)
        for p, q in zip(a[0].model.parameters(), b[0].model.parameters(), strict=True):
            torch.testing.assert_close(p, q, atol=1e-4, rtol=0)
    finally:
        b[0].close()
