"""The vLLM engine against a float32 HF forward of the same weights (``make test-vllm``; CPU build).

One engine serves the whole module (an engine takes 20-60 s to start on 2 cores and its idle
worker keeps polling); the last test closes it and checks that nothing is left behind.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from horizonrl.inference import HFEngine, SamplingParams, make_engine  # noqa: E402
from horizonrl.inference.vllm_engine import VLLMEngine  # noqa: E402
from horizonrl.inference.vllm_procs import descendants, shm_segments  # noqa: E402
from horizonrl.models import load_model_and_tokenizer  # noqa: E402

TOL = 1e-5  # float32 log-probs, vLLM vs a teacher-forced HF forward


@pytest.fixture(scope="module")
def policy(vllm_tiny_dir):
    model, tok = load_model_and_tokenizer(vllm_tiny_dir)
    return model.eval(), tok


@pytest.fixture(scope="module")
def engine(policy):
    model, tok = policy
    eng = make_engine("vllm", model, tok, device="cpu", max_batch_size=16, seed=0)
    yield eng
    eng.close()


def _prompts(n, vocab, seed=0, lo=8, hi=40):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(5, vocab, size=int(rng.integers(lo, hi)))] for _ in range(n)]


@torch.inference_mode()
def _hf_logprobs(model, prompt, cont, temperature=1.0):
    logits = model(torch.tensor([prompt + cont])).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(cont)[:, None]).squeeze(-1).numpy()


def _max_diff(model, prompts, gens, temperature=1.0):
    return max(
        float(np.abs(np.asarray(g.logprobs) - _hf_logprobs(model, p, g.ids, temperature)).max())
        for p, g in zip(prompts, gens, strict=True)
    )


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_match_hf(engine, policy, temperature):
    model, tok = policy
    prompts = _prompts(6, len(tok))
    gens = engine.generate(prompts, SamplingParams(temperature=temperature, max_new_tokens=24))
    assert all(len(g.ids) == len(g.logprobs) > 0 for g in gens)
    assert _max_diff(model, prompts, gens, temperature) < TOL


def test_greedy_matches_hf_engine(engine, policy):
    """Same tokens as HFEngine's greedy decoding, temperature-1 log-probs, same finish reasons."""
    model, tok = policy
    prompts = _prompts(4, len(tok), seed=1)
    params = SamplingParams(greedy=True, temperature=0.5, max_new_tokens=16)
    ours, ref = engine.generate(prompts, params), HFEngine(model, tok).generate(prompts, params)
    for a, b in zip(ours, ref, strict=True):
        assert a.ids == b.ids and a.finish_reason == b.finish_reason and a.text == b.text
        assert np.abs(np.asarray(a.logprobs) - np.asarray(b.logprobs)).max() < TOL


def test_top_p_logprobs_are_renormalised_over_the_nucleus(engine, policy):
    """The documented difference: vLLM's log-prob = HF's full-vocabulary one - log(nucleus mass)."""
    model, tok = policy
    prompts, top_p, t = _prompts(4, len(tok), seed=2), 0.8, 0.7
    gens = engine.generate(prompts, SamplingParams(temperature=t, top_p=top_p, max_new_tokens=12))
    diffs = []
    for p, g in zip(prompts, gens, strict=True):
        with torch.inference_mode():
            logits = model(torch.tensor([p + g.ids])).logits[0, len(p) - 1 : -1].float() / t
        probs = torch.softmax(logits, -1)
        for j, tok_id in enumerate(g.ids):
            sorted_p, order = probs[j].sort(descending=True)
            before = sorted_p.cumsum(0) - sorted_p
            nucleus = order[before < top_p]  # HFEngine's nucleus: higher-ranked mass < top_p
            assert tok_id in nucleus.tolist()
            want = torch.log(probs[j, tok_id]) - torch.log(probs[j, nucleus].sum())
            diffs.append(abs(float(want) - g.logprobs[j]))
    assert max(diffs) < 1e-4


def test_score_matches_hf_engine(engine, policy):
    model, tok = policy
    ctxs, conts = _prompts(5, len(tok), seed=3), _prompts(5, len(tok), seed=4, lo=1, hi=20)
    conts[2] = []
    ours, ref = engine.score(ctxs, conts), HFEngine(model, tok).score(ctxs, conts)
    assert [len(x) for x in ours] == [len(c) for c in conts]
    assert max(float(np.abs(a - b).max()) for a, b in zip(ours, ref, strict=True) if len(a)) < TOL


def _same(ours, ref):
    for a, b in zip(ours, ref, strict=True):
        assert (a.ids, a.finish_reason, a.meta.get("stop"), a.text) == (
            b.ids,
            b.finish_reason,
            b.meta.get("stop"),
            b.text,
        )
        assert np.abs(np.asarray(a.logprobs) - np.asarray(b.logprobs)).max() < TOL


def test_eos_ids_end_generations_like_hf(engine, policy):
    model, tok = policy
    hf = HFEngine(model, tok)
    prompts = _prompts(3, len(tok), seed=5)
    saved = engine.eos_ids
    engine.eos_ids = frozenset()  # nothing stops a generation, not even the model's own eos
    try:
        free = engine.generate(prompts, SamplingParams(greedy=True, max_new_tokens=20))
    finally:
        engine.eos_ids = saved
    assert all(len(g.ids) == 20 and g.finish_reason == "length" for g in free)
    eos = free[0].ids[5]  # pretend a token of the first continuation ends generations
    saved = engine.eos_ids, hf.eos_ids
    engine.eos_ids = hf.eos_ids = frozenset({eos})
    try:
        params = SamplingParams(greedy=True, max_new_tokens=20)
        ours, ref = engine.generate(prompts, params), hf.generate(prompts, params)
    finally:
        engine.eos_ids, hf.eos_ids = saved
    assert ours[0].ids == free[0].ids[: free[0].ids.index(eos) + 1]
    assert ours[0].finish_reason == "stop" and ours[0].meta["stop"] == eos
    _same(ours, ref)


def test_stop_strings_end_generations_like_hf(engine, policy):
    model, tok = policy
    prompts = _prompts(3, len(tok), seed=11)
    free = engine.generate(prompts, SamplingParams(greedy=True, max_new_tokens=24))
    text = free[1].text
    assert len(text) >= 8
    params = SamplingParams(greedy=True, max_new_tokens=24, stop=("\x00never", text[4:7]))
    ours = engine.generate(prompts, params)
    _same(ours, HFEngine(model, tok).generate(prompts, params))
    assert ours[1].meta["stop"] == text[4:7] and len(ours[1].ids) < len(free[1].ids)


def test_seeds_come_from_the_engine_rng(engine, policy):
    _, tok = policy
    prompts, params = _prompts(4, len(tok), seed=6), SamplingParams(max_new_tokens=16)
    engine.set_seed(7)
    a = engine.generate(prompts, params)
    state = engine.rng_state()
    b = engine.generate(prompts, params)
    engine.set_seed(7)
    assert [g.ids for g in engine.generate(prompts, params)] == [g.ids for g in a]
    engine.set_rng_state(state)  # a resumed run draws the same seeds
    assert [g.ids for g in engine.generate(prompts, params)] == [g.ids for g in b]
    assert [g.ids for g in a] != [g.ids for g in b]


def test_prefix_caching_reuses_shared_prefixes(engine, policy):
    model, tok = policy
    prefix = _prompts(1, len(tok), seed=7, lo=272, hi=273)[0]  # CPU KV blocks hold 128 tokens
    prompts = [prefix + s for s in _prompts(4, len(tok), seed=8, lo=4, hi=8)]
    params = SamplingParams(greedy=True, max_new_tokens=8)
    cold = engine.generate(prompts, params)
    warm = engine.generate(prompts, params)
    assert all(g.meta["cached_tokens"] >= 256 for g in warm)
    assert [g.ids for g in cold] == [g.ids for g in warm]
    assert _max_diff(model, prompts, warm) < TOL


def test_stream_gives_each_request_what_generate_gives_it(engine, policy):
    """vLLM's continuous batching as a stream: requests join between engine steps, with their own seeds."""
    _, tok = policy
    prompts = _prompts(7, len(tok), seed=9)
    params = [
        SamplingParams(temperature=0.8, max_new_tokens=10),
        SamplingParams(max_new_tokens=6, stop=("a",)),
    ]
    stream = engine.open_stream()
    got, k, steps = {}, 0, 0
    while k < len(prompts) or stream.pending:
        if k < len(prompts) and steps % 2 == 0:  # a new request every other step
            stream.add(k, prompts[k], params[k % 2], 500 + k)
            k += 1
        got.update(stream.step())
        steps += 1
    assert sorted(got) == list(range(7))
    for i, p in enumerate(prompts):
        (want,) = engine.generate([p], params[i % 2], seeds=[500 + i])
        assert (
            got[i].ids == want.ids and got[i].finish_reason == want.finish_reason and got[i].text == want.text
        )
        np.testing.assert_allclose(got[i].logprobs, want.logprobs, atol=TOL)


def test_async_driver_on_vllm_matches_sync_with_path_seeds(engine, policy):
    from horizonrl.agents.driver import Generate, drive

    _, tok = policy
    prompts = _prompts(6, len(tok), seed=10)
    params = SamplingParams(max_new_tokens=8)

    def prog(i):
        out = []
        for turn in range(1 + i % 3):
            g = yield Generate(prompts[i] + [7] * turn, params)
            out.append(g.ids)
        return out

    engine.set_seed(3)
    sync = drive(engine, [prog(i) for i in range(6)], mode="sync", path_seeds=True)
    engine.set_seed(3)
    assert drive(engine, [prog(i) for i in range(6)], mode="async") == sync


def test_sync_updates_weights_in_place(engine, policy):
    """After a training-like update, vLLM matches HF with the new weights (the tied-head refresh)."""
    model, tok = policy
    prompts, params = _prompts(4, len(tok), seed=9), SamplingParams(greedy=True, max_new_tokens=12)
    old_sd = {k: v.clone() for k, v in model.state_dict().items()}
    before = engine.generate(prompts, params)
    syncs = engine.syncs
    engine.sync()  # nothing changed: nothing is sent
    assert engine.syncs == syncs
    g = torch.Generator().manual_seed(0)
    try:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.05 * (float(p.std()) + 1e-3))
        engine.sync()  # what the trainers call after every update
        assert engine.syncs == syncs + 1
        after = engine.generate(prompts, params)
        assert _max_diff(model, prompts, after) < TOL
        # The update is visible: new ids, or (a barely trained model's greedy ids may not move) new
        # log-probs of the same ids. A sync that sent nothing fails here.
        same = [(a, b) for a, b in zip(after, before, strict=True) if a.ids == b.ids]
        moved = max((float(np.abs(np.subtract(a.logprobs, b.logprobs)).max()) for a, b in same), default=0.0)
        assert len(same) < len(after) or moved > 100 * TOL
        # An explicit state dict (a stale engine's sync) loads exactly those weights.
        engine.sync(old_sd)
        again = engine.generate(prompts, params)
        assert [a.ids for a in again] == [b.ids for b in before]
        assert (
            max(
                float(np.abs(np.asarray(a.logprobs) - np.asarray(b.logprobs)).max())
                for a, b in zip(again, before, strict=True)
            )
            < TOL
        )
    finally:
        model.load_state_dict(old_sd)
        engine.sync()
    assert _max_diff(model, prompts, engine.generate(prompts, params)) < TOL


def test_collective_weight_sync_loads_what_the_file_route_loads(engine, policy, monkeypatch):
    """``weight_sync: collective``: the weights go over the gloo group, never through a file, and vLLM
    then holds exactly what the file route loads for the same state dict."""
    import horizonrl.inference.vllm_weights as vllm_weights

    model, tok = policy
    prompts, params = _prompts(4, len(tok), seed=11), SamplingParams(greedy=True, max_new_tokens=12)
    old_sd = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    new_sd = {
        k: v + torch.randn(v.shape, generator=g) * 0.05 * (float(v.std()) + 1e-3) for k, v in old_sd.items()
    }
    try:
        engine.sync(new_sd)  # the file route
        by_file = engine.param_sum()
        file_gens = engine.generate(prompts, params)
        engine.sync(old_sd)
        assert engine.param_sum() != by_file
        engine.weight_sync = "collective"

        def no_file(*a, **k):
            raise AssertionError("the collective route wrote a weight file")

        monkeypatch.setattr(vllm_weights, "write_weights", no_file)
        for _ in range(2):  # the group is built once and reused
            engine.sync(new_sd)
        assert engine._bus is not None and engine.last_sync_bytes > 0
        assert engine.param_sum() == by_file
        gens = engine.generate(prompts, params)
        assert [x.ids for x in gens] == [x.ids for x in file_gens]
        assert (
            max(
                float(np.abs(np.subtract(a.logprobs, b.logprobs)).max())
                for a, b in zip(gens, file_gens, strict=True)
            )
            == 0.0
        )
        model.load_state_dict(new_sd)
        assert _max_diff(model, prompts, gens) < TOL
    finally:
        engine.weight_sync = "file"
        monkeypatch.undo()
        model.load_state_dict(old_sd)
        engine.sync(old_sd)


def test_unknown_weight_sync_route_is_refused_by_name(policy):
    model, tok = policy
    with pytest.raises(ValueError, match=r"weight_sync='nccl'.*'file', 'collective'"):
        VLLMEngine(model, tok, weight_sync="nccl")


def test_sleep_and_wake_on_cpu_are_accepted(engine, policy):
    """CPU: vLLM accepts sleep/wake_up and frees nothing; generation works afterwards."""
    model, tok = policy
    engine.sleep_level = 1
    try:
        engine.sleep()
        assert engine._asleep == 1
        prompts = _prompts(2, len(tok), seed=10)
        gens = engine.generate(prompts, SamplingParams(greedy=True, max_new_tokens=6))
        assert engine._asleep == 0 and _max_diff(model, prompts, gens) < TOL
    finally:
        engine.sleep_level = 0


def test_bad_prompts_are_clear_errors(engine):
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([[]], SamplingParams())
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate([[5] * engine.max_model_len], SamplingParams())


def test_killed_owner_leaves_no_engine_processes_or_shared_memory(vllm_tiny_dir, tmp_path):
    """SIGKILL of the process that holds an engine: the reaper stops vLLM's processes, frees /dev/shm."""
    script = tmp_path / "owner.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            from horizonrl.inference.vllm_engine import VLLMEngine

            if __name__ == "__main__":
                eng = VLLMEngine({str(vllm_tiny_dir)!r}, max_batch_size=2)
                print("READY", flush=True)
                sys.stdin.read()
            """
        )
    )
    before = shm_segments()
    owner = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert "READY" in owner.stdout.readline()
        kids = descendants(owner.pid)
        made = shm_segments() - before
        assert kids and made
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    finally:
        if owner.poll() is None:
            owner.kill()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (_alive(kids) or made & shm_segments()):
        time.sleep(0.5)
    assert not _alive(kids)
    assert not made & shm_segments()


def _alive(pids) -> set[int]:
    out = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.add(pid)
    return out


def test_close_stops_the_engine_and_frees_everything(engine):
    """Runs last: close() ends vLLM's processes and unlinks its queues (no leaked shared memory)."""
    assert isinstance(engine, VLLMEngine)
    assert engine.pids and engine.shm_segments
    engine.close()
    engine.close()  # idempotent
    assert not _alive(engine.pids)
    assert not engine.shm_segments & shm_segments()
    with pytest.raises(RuntimeError, match="closed"):
        engine.generate([[5, 6]], SamplingParams())
