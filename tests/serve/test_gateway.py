"""`horizonrl gateway`: agent loops written with the official ``openai`` client (and the OpenAI Agents
SDK) against a real gateway on 127.0.0.1, recorded token-exactly; the gateway trainer on the tiny model.

Expectations are computed independently of the recorder: prompts by the chat template, log-probs by
teacher forcing with the engine's ``score`` (a forward pass, not the sampler), token strings and
log-probs by what the API returned to the client.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import numpy as np  # noqa: E402

from horizonrl.trajectory import build_rows  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "search the corpus",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
]
SYSTEM = {"role": "system", "content": "You answer questions. Use the search tool."}


@pytest.fixture(scope="module")
def gw(tiny_model_dir):
    """A gateway over the real tiny model (HFEngine), served by uvicorn in a thread; stopped at the end."""
    from horizonrl.config import ModelConfig
    from horizonrl.gateway import Gateway, ServerThread
    from horizonrl.inference import HFEngine
    from horizonrl.models import load_tokenizer
    from horizonrl.train.warmstart.bootstrap import load_policy

    model, tok = load_policy(
        ModelConfig(path=str(tiny_model_dir), device="cpu"), init=None, work_dir=tiny_model_dir
    )
    engine = HFEngine(model.eval(), load_tokenizer(tiny_model_dir), seed=0)
    gateway = Gateway(engine, tok, "policy", default_max_tokens=16)
    server = ServerThread(gateway.app).start()
    yield gateway, server.url, engine
    server.stop()
    gateway.scheduler.close()


def _client(url: str, episode: str):
    return openai.OpenAI(base_url=f"{url}/episodes/{episode}/v1", api_key="unused", max_retries=0, timeout=60)


def _check_tokens_are_the_engines(engine, rollout):
    """Every turn's log-probs are the model's, teacher-forced on exactly the recorded prompt ids."""
    turns = rollout.turns
    scored = engine.score([t.prompt_ids for t in turns], [t.response_ids for t in turns])
    for t, lp in zip(turns, scored, strict=True):
        assert len(t.response_ids) == len(t.logprobs) > 0
        np.testing.assert_allclose(t.logprobs, lp, atol=1e-4)


def _assistant(choice) -> dict:
    """The assistant message as an agent loop sends it back (the SDK's own serialization)."""
    return choice.message.model_dump(exclude_none=True, exclude={"refusal", "annotations", "audio"})


def test_openai_loop_records_sessions_token_exactly(gw):
    gateway, url, engine = gw
    renderer = gateway.renderer
    client = _client(url, "loop-1")
    msgs = [SYSTEM, {"role": "user", "content": "Where does Ana live?"}]
    r1 = client.chat.completions.create(
        model="policy", messages=msgs, tools=TOOLS, logprobs=True, max_tokens=8
    )
    msgs += [_assistant(r1.choices[0]), {"role": "user", "content": "Search again, please."}]
    r2 = client.chat.completions.create(
        model="policy", messages=msgs, tools=TOOLS, logprobs=True, max_tokens=8
    )
    msgs.append(_assistant(r2.choices[0]))
    # The harness rewrites its context: a summary call, then a fresh context quoting the summary.
    history = "\n".join(str(m.get("content")) for m in msgs)
    r3 = client.chat.completions.create(
        model="policy",
        messages=[
            {"role": "system", "content": "Summarize the conversation."},
            {"role": "user", "content": history},
        ],
        max_tokens=40,
        extra_body={"ignore_eos": True},
    )
    summary = r3.choices[0].message.content.strip()
    assert len(summary) >= 20
    fresh = [SYSTEM, {"role": "user", "content": f"Where does Ana live?\nWhat we know so far: {summary}"}]
    r4 = client.chat.completions.create(model="policy", messages=fresh, tools=TOOLS, max_tokens=8)
    ok = httpx.post(f"{url}/v1/episodes/loop-1/reward", json={"reward": 1.0, "final_answer": "Paris"})
    assert ok.status_code == 200 and ok.json()["reward"] == 1.0

    rollout = gateway.recorder.rollout("loop-1")
    assert (rollout.reward, rollout.success, rollout.final_answer) == (1.0, True, "Paris")
    assert [(s.kind, s.parent, len(s.turns)) for s in rollout.segments] == [
        ("normal", None, 2),
        ("compaction", 0, 1),
        ("normal", 1, 1),
    ]
    (t0, t1), (t2,), (t3,) = (s.turns for s in rollout.segments)
    # What the engine saw: the template's rendering of the first request ...
    assert t0.prompt_ids == renderer.initial_ids(msgs[:2], TOOLS)
    # ... and the returned tokens and log-probs are the ones recorded.
    for turn, resp in ((t0, r1), (t1, r2)):
        entries = resp.choices[0].logprobs.content
        assert [e.logprob for e in entries] == turn.logprobs
        assert [e.token for e in entries] == [
            gateway.renderer.tokenizer.decode([i]) for i in turn.response_ids
        ]
    # The second call continues the first token for token, so the two turns train as one row.
    ctx = t0.prompt_ids + t0.response_ids
    assert t1.prompt_ids[: len(ctx)] == ctx
    rows = build_rows([rollout])
    assert [r.segment_index for r in rows] == [0, 1, 2]
    assert t0.observation is not None and "Search again, please." in t0.observation
    # The summary session is linked as Mosaic compaction: h- = what it summarized, h+ = the next prompt.
    comp = rollout.segments[1]
    assert comp.fork_index == 0 and comp.info["h_minus"] == t1.prompt_ids + t1.response_ids
    assert comp.info["h_plus"] == t3.prompt_ids == renderer.initial_ids(fresh, TOOLS)
    assert t2.prompt_ids == renderer.initial_ids(
        [{"role": "system", "content": "Summarize the conversation."}, {"role": "user", "content": history}]
    )
    _check_tokens_are_the_engines(engine, rollout)
    assert r4.usage.prompt_tokens == len(t3.prompt_ids)


def test_streaming_subagents_and_header_mode(gw):
    gateway, url, engine = gw
    parent = openai.OpenAI(
        base_url=f"{url}/v1", api_key="unused", max_retries=0, default_headers={"X-Episode-Id": "main-2"}
    )
    msgs = [SYSTEM, {"role": "user", "content": "Who is Bo?"}]
    streamed, lps = [], []
    for chunk in parent.chat.completions.create(
        model="policy", messages=msgs, tools=TOOLS, stream=True, logprobs=True, max_tokens=10
    ):
        for c in chunk.choices:
            streamed.append(c.delta.content or "")
            lps += [e.logprob for e in (c.logprobs.content if c.logprobs and c.logprobs.content else [])]
    first_reply = {"role": "assistant", "content": "".join(streamed)}
    # Two subagents forked from the parent's first turn, each its own episode declaring its parent.
    for k in range(2):
        child = openai.OpenAI(
            base_url=f"{url}/episodes/child-2-{k}/v1",
            api_key="unused",
            max_retries=0,
            default_headers={"X-Parent-Episode": "main-2"},
        )
        child.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": f"Find Bo, part {k}"}]
        )
    msgs += [first_reply, {"role": "user", "content": "The subagents found: Bo is a pilot."}]
    parent.chat.completions.create(model="policy", messages=msgs, tools=TOOLS, max_tokens=6)
    bad = httpx.post(f"{url}/v1/episodes/child-2-0/reward", json={"reward": 1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "episode_id"
    assert httpx.post(f"{url}/v1/episodes/main-2/reward", json={"reward": 0}).status_code == 200

    rollout = gateway.recorder.rollout("main-2")
    assert [(s.kind, s.parent, s.fork_index, len(s.turns)) for s in rollout.segments] == [
        ("normal", None, None, 2),
        ("subagent", 0, 0, 1),
        ("subagent", 0, 1, 1),
    ]
    main, c0, c1 = rollout.segments
    assert main.turns[0].logprobs == lps  # streamed log-probs are the recorded ones
    for child in (c0, c1):
        assert child.info["h_minus"] == main.turns[0].prompt_ids
        assert child.info["h_plus"] == main.turns[1].prompt_ids
    assert rollout.env["metrics"] == {"gateway_calls": 2.0, "gateway_subagents": 2.0}
    assert (rollout.reward, rollout.success) == (0.0, False)
    _check_tokens_are_the_engines(engine, rollout)
    got = httpx.get(f"{url}/v1/episodes/main-2").json()
    assert got["rollout"]["segments"][1]["kind"] == "subagent" and got["calls"] == 2


_X = {"messages": [{"role": "user", "content": "x"}]}


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status", "param"),
    [
        ("post", "/v1/chat/completions", _X, {}, 400, "X-Episode-Id"),
        ("post", "/episodes/bad id!/v1/chat/completions", _X, {}, 400, "episode_id"),
        ("post", "/episodes/e-n/v1/chat/completions", {**_X, "n": 2}, {}, 400, "n"),
        ("post", "/episodes/e-k/v1/chat/completions", _X, {"X-Session-Kind": "weird"}, 400, "X-Session-Kind"),
        (
            "post",
            "/episodes/e-p/v1/chat/completions",
            _X,
            {"X-Parent-Episode": "nobody"},
            404,
            "X-Parent-Episode",
        ),
        (
            "post",
            "/episodes/e-m/v1/chat/completions",
            {"messages": [{"role": "robot"}]},
            {},
            400,
            "messages.0.role",
        ),
        ("post", "/v1/episodes/nobody/reward", {"reward": 1.0}, {}, 404, "episode_id"),
        ("post", "/v1/episodes/loop-1/reward", {"reward": "high"}, {}, 400, "reward"),
        ("post", "/v1/episodes/loop-1/reward", {}, {}, 400, "reward"),
        ("get", "/v1/episodes/nobody", None, {}, 404, "episode_id"),
    ],
)
def test_malformed_requests_are_4xx_naming_the_field(gw, method, path, body, headers, status, param):
    _, url, _ = gw
    r = httpx.request(method, url + path, json=body, headers=headers)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"].startswith(param + ":"), err


def test_non_finite_reward_and_closed_episode(gw):
    gateway, url, _ = gw
    r = httpx.post(
        f"{url}/v1/episodes/loop-1/reward",
        content='{"reward": NaN}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "reward"
    client = _client(url, "closed-1")
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    gateway.recorder.close("closed-1")
    with pytest.raises(openai.ConflictError) as info:
        client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "x"}], max_tokens=2
        )
    assert info.value.body["param"] == "episode_id" and "closed" in info.value.body["message"]


def test_openai_agents_sdk_tool_round_trip_is_one_session(gw):
    """The OpenAI Agents SDK (chat-completions model, blocking and streamed) against the gateway.

    The random tiny model cannot call a tool, so a copy of it is first fine-tuned on the two prompts the
    SDK's loop will send (read from a recorded probe episode and built independently with the chat
    template): the forced ``search`` call, then the answer after the tool result.
    """
    agents = pytest.importorskip("agents", reason="the OpenAI Agents SDK (openai-agents) is not installed")
    import asyncio
    import copy

    import torch

    from horizonrl.gateway import Gateway, ServerThread
    from horizonrl.inference import HFEngine

    base, _, base_engine = gw
    model = copy.deepcopy(base_engine.model)
    tok = base.renderer.tokenizer
    gateway = Gateway(HFEngine(model, tok, seed=0), tok, "policy", default_max_tokens=24)
    server = ServerThread(gateway.app).start()
    agents.set_tracing_disabled(True)
    queries: list[str] = []

    @agents.function_tool
    def search(query: str) -> str:
        """Search the corpus."""
        queries.append(query)
        return "Ana lives in Paris."

    def agent(episode: str):
        client = openai.AsyncOpenAI(
            base_url=f"{server.url}/episodes/{episode}/v1", api_key="unused", max_retries=0
        )
        return agents.Agent(
            name="searcher",
            instructions="Answer the question.",
            model=agents.OpenAIChatCompletionsModel(model="policy", openai_client=client),
            tools=[search],
            model_settings=agents.ModelSettings(max_tokens=24, temperature=0, tool_choice="search"),
        )

    try:
        agents.Runner.run_sync(agent("probe"), "Where does Ana live?", max_turns=2)
        p1 = gateway.recorder.rollout("probe").turns[0].prompt_ids
        seen = tok.decode(p1)
        assert (
            "Answer the question." in seen and "Where does Ana live?" in seen and '"name": "search"' in seen
        )
        assert seen.endswith(
            '<|im_start|>assistant\n<tool_call>{"name": "search", "arguments":'
        )  # named prefill
        eos = gateway.renderer.eos_id
        t1 = [*tok.encode('{"query": "Ana"}}</tool_call>', add_special_tokens=False), eos]
        p2 = p1 + t1 + gateway.renderer.continuation_ids([{"role": "tool", "content": "Ana lives in Paris."}])
        t2 = [*tok.encode("Paris", add_special_tokens=False), eos]
        torch.manual_seed(0)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        model.train()
        for _ in range(300):
            loss = sum(
                torch.nn.functional.cross_entropy(
                    model(torch.tensor([p + t])).logits[0, len(p) - 1 : -1], torch.tensor(t)
                )
                for p, t in ((p1, t1), (p2, t2))
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
            if loss.item() < 0.02:
                break
        model.eval()

        result = agents.Runner.run_sync(agent("sdk-1"), "Where does Ana live?", max_turns=3)

        async def streamed():
            run = agents.Runner.run_streamed(agent("sdk-2"), "Where does Ana live?", max_turns=3)
            async for _ in run.stream_events():
                pass
            return run.final_output

        assert (result.final_output, asyncio.run(streamed())) == ("Paris", "Paris")
        assert queries == ["Ana", "Ana"]
        for episode in ("sdk-1", "sdk-2"):
            rollout = gateway.recorder.rollout(episode)
            (seg,) = rollout.segments  # the SDK re-sent its tool call: the second call continues the first
            assert [t.prompt_ids for t in seg.turns] == [p1, p2]
            assert [t.response_ids for t in seg.turns] == [t1, t2]
            assert seg.turns[0].tool_calls == 1 and seg.turns[0].observation is not None
            _check_tokens_are_the_engines(gateway.scheduler.engine, rollout)
    finally:
        server.stop()
        gateway.scheduler.close()


# -- the trainer ------------------------------------------------------------------------------------------

HARNESS = textwrap.dedent(
    '''
    """A tiny agent loop with context compaction against the gateway; used by test_gateway.py."""
    import httpx
    import openai

    def run(task, base_url, episode_id, reward_url):
        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
        msgs = [{"role": "user", "content": task["prompt"]}]
        first = client.chat.completions.create(model="policy", messages=msgs, max_tokens=6, temperature=0.5)
        msgs += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "Go on."}]
        second = client.chat.completions.create(model="policy", messages=msgs, max_tokens=6)
        history = "\\n".join(m["content"] for m in msgs) + second.choices[0].message.content
        # The summary call declares itself: how it would be recognized from its text (the next prompt
        # quoting >= 20 of its characters) depends on what the tiny model samples, and with the episodes
        # running concurrently that is not the same on every run (test_openai_loop_... covers the text).
        summary = client.chat.completions.create(
            model="policy", max_tokens=30, extra_body={"ignore_eos": True},
            extra_headers={"X-Session-Kind": "compaction"},
            messages=[{"role": "system", "content": "Summarize."}, {"role": "user", "content": history}],
        ).choices[0].message.content
        fresh = [{"role": "user", "content": task["prompt"] + "\\nNotes: " + summary.strip()}]
        final = client.chat.completions.create(model="policy", messages=fresh, max_tokens=6)
        if episode_id.endswith("-1") and episode_id.startswith("s"):
            return None  # this harness never reports an outcome for its second episode of a task
        text = final.choices[0].message.content or ""
        httpx.post(reward_url, json={"reward": float(len(text) % 2)})  # any outcome the harness computes
        return None
    '''
)


def test_gateway_trainer_two_steps(tiny_model_dir, tmp_path, monkeypatch):
    from horizonrl.config import from_dict
    from horizonrl.train.trainers.registry import make_trainer
    from horizonrl.trajectory import read_jsonl

    (tmp_path / "my_harness.py").write_text(HARNESS)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_harness", None)
    cfg = from_dict(
        {
            "model": {"path": str(tiny_model_dir), "device": "cpu"},
            "env": {"name": "arithmetic", "train_tasks": 8, "test_tasks": 2},
            "rollout": {"group_size": 3, "tasks_per_step": 2, "max_new_tokens": 6, "context_budget": 512},
            "train": {
                "trainer": "gateway",
                "steps": 2,
                "out_dir": str(tmp_path / "run"),
                "eval_samples": 1,
                "save_every": 0,
                "progress": False,
            },
            "algo": {"estimator": "mosaic"},
            "gateway": {"callable": "my_harness:run", "reward_timeout_s": 0.5},
        }
    )
    trainer = make_trainer(cfg)
    records = trainer.fit()
    steps = [r for r in records if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    for m in steps:
        assert m["gateway/episodes"] == 6
        assert m["gateway/dropped_episodes"] == 2 == m["gateway/unrewarded_episodes"]  # one per task
        assert m["gateway/spliced_call_rate"] == 0.25  # the second of four calls continues the first
        assert m["gateway/overridden_sampling"] == 6  # the first call asked for temperature 0.5
        assert m["rollout/sessions_mean"] == 3.0 and m["rollout/turns_mean"] == 4.0
        assert m["rollout/sessions_compaction_mean"] == 1.0
        assert m["ig/eligible_sessions"] == 8  # Mosaic: the first and the compaction session of 4 rollouts
        assert abs(m["train/ratio_geomean"] - 1.0) < 1e-3
    rollouts = list(read_jsonl(tmp_path / "run" / "rollouts" / "step_2.jsonl"))
    assert len(rollouts) == 4 and all(r.env["rewarded"] for r in rollouts)
    assert sorted(r.uid for r in rollouts) == ["s1-0-0", "s1-0-2", "s1-1-0", "s1-1-2"]
    assert all(r.reward in (0.0, 1.0) for r in rollouts)
    assert all([s.kind for s in r.segments] == ["normal", "compaction", "normal"] for r in rollouts)
    assert (tmp_path / "run" / "checkpoints").is_dir()


def test_gateway_trainer_config_errors(tiny_model_dir, tmp_path):
    from horizonrl.config import ConfigError, from_dict
    from horizonrl.train.trainers.registry import make_trainer

    base = {"model": {"path": str(tiny_model_dir)}, "train": {"trainer": "gateway", "out_dir": str(tmp_path)}}
    with pytest.raises(ConfigError, match=r"exactly one of gateway\.command and gateway\.callable"):
        make_trainer(from_dict(base))
    with pytest.raises(ConfigError, match=r"gateway.callable='nope': expected 'package.module:function'"):
        make_trainer(from_dict({**base, "gateway": {"callable": "nope"}}))
    with pytest.raises(ConfigError, match=r"gateway.reward='bogus': unknown reward"):
        make_trainer(from_dict({**base, "gateway": {"command": "true", "reward": "bogus"}}))
    with pytest.raises(ConfigError, match=r"gateway\.port=70000"):
        from_dict({**base, "gateway": {"port": 70000}})


COMMAND_HARNESS = textwrap.dedent(
    """
    import json, os
    import httpx, openai
    task = json.load(open(os.environ["HORIZONRL_TASK_FILE"]))
    client = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL / OPENAI_API_KEY come from the gateway
    out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": task["prompt"]}],
                                         max_tokens=4)
    httpx.post(os.environ["HORIZONRL_REWARD_URL"], json={"reward": 0.5, "final_answer": task["answer"]})
    print(0.5)
    """
)


def test_cli_gateway_records_a_command_harness(tiny_model_dir, tmp_path):
    """`horizonrl gateway MODEL --out DIR` (record only) and a command harness with its environment."""
    import os
    import socket
    import subprocess
    import time

    from horizonrl.envs.core.base import Task
    from horizonrl.gateway.harness import EpisodeRun, Harness
    from horizonrl.trajectory import read_jsonl

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "horizonrl.cli", "gateway", str(tiny_model_dir), "--port", str(port)]
    cmd += ["--out", str(out), "--device", "cpu", "--model-name", "tiny", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "horizonrl gateway did not start"
            time.sleep(0.1)
        script = tmp_path / "agent.py"
        script.write_text(COMMAND_HARNESS)
        harness = Harness(command=f"{sys.executable} {script}", timeout_s=60, workdir=tmp_path / "h")
        task = Task(id="t1", prompt="What is 2+2?", answer="4")
        res = harness.run(EpisodeRun("cmd-1", task, url))
        assert (res.reward, res.error, res.timed_out) == (0.5, None, False)
        (rollout,) = read_jsonl(out / "rollouts.jsonl")
        assert (rollout.uid, rollout.reward, rollout.final_answer, rollout.num_turns) == (
            "cmd-1",
            0.5,
            "4",
            1,
        )
        closed = httpx.post(f"{url}/episodes/cmd-1/v1/chat/completions", json=_X)
        assert closed.status_code == 409  # a rewarded episode is closed in record-only mode
        slow = Harness(command="sleep 30", timeout_s=0.5, workdir=tmp_path / "h")
        t0 = time.monotonic()
        res = slow.run(EpisodeRun("cmd-2", task, url))
        assert res.timed_out and time.monotonic() - t0 < 5
    finally:
        proc.terminate()
        proc.wait(timeout=20)
