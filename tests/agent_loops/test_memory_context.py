"""ECHO turn memory (docs/spec/echo.md "Rollout"; paper Algorithm 1): repair operator, parsing, the loop."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
import torch

from horizonrl.agents import memory
from horizonrl.agents.context import make_context
from horizonrl.agents.driver import run_program
from horizonrl.agents.expert import ExpertEngine
from horizonrl.agents.memory import (
    HINT,
    SUM_CLOSE,
    SUM_OPEN,
    locate_finding,
    parse_selection,
    render_action,
    repair_selection,
    semantic_topk,
)
from horizonrl.agents.react import LoopLimits, episode_program, run_episodes, start_episode
from horizonrl.agents.summary import STATE_KEY
from horizonrl.config import from_dict
from horizonrl.credit import get_estimator
from horizonrl.envs import get_env
from horizonrl.inference import HFEngine
from horizonrl.inference.base import SamplingParams
from horizonrl.models import ChatRenderer, TinyModelConfig, build_tiny_model, train_tokenizer
from horizonrl.train.recipes import expert_program_rows
from horizonrl.train.warmstart.bootstrap import tokenizer_corpus
from horizonrl.trajectory import Group, build_rows, rollout_from_dict, rollout_to_dict

KNOBS = {"hops": 4, "n_entities": 4, "obs_facts": 6}
BUDGET, NEW = 672, 72


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(tokenizer_corpus(seed=0), vocab_size=768, seed=0)


@pytest.fixture(scope="module")
def renderer(tok):
    return ChatRenderer(tok)


# ----------------------------------------------------------------------------------- repair


def test_repair_keeps_valid_in_model_order_and_merges_latest():
    rep = repair_selection([4, 1, 2], range(8), max_selected=8, keep_latest=3)
    assert rep.selected == (4, 1, 2) and rep.kept_latest == (5, 6, 7)
    assert rep.kept == (1, 2, 4, 5, 6, 7) and rep.fits and rep.cost is None
    assert rep.counts() == dict.fromkeys(
        ("malformed", "out_of_range", "duplicates", "over_cap", "over_budget"), 0
    )


def test_repair_drops_malformed_out_of_range_and_duplicates():
    entries = ["turn_x: nope", 2, 9, 2, -1, True, "", 0]
    rep = repair_selection(entries, [0, 1, 2, 3], max_selected=8, keep_latest=1)
    assert rep.selected == (2, 0)
    assert rep.malformed == ("turn_x: nope", "True", "")
    assert rep.out_of_range == (9, -1)
    assert rep.duplicates == (2,)
    assert rep.kept_latest == (3,) and rep.kept == (0, 2, 3)


def test_repair_keeps_first_s_and_counts_repeats_of_capped_as_duplicates():
    rep = repair_selection([3, 1, 0, 2, 0, 2], range(6), max_selected=2, keep_latest=0)
    assert rep.selected == (3, 1)
    assert rep.over_cap == (0, 2) and rep.duplicates == (0, 2)
    assert rep.kept_latest == () and rep.kept == (1, 3)


def test_repair_latest_k_larger_than_memory_and_overlap_with_selection():
    rep = repair_selection([1], [0, 1], max_selected=8, keep_latest=3)
    assert rep.kept_latest == (0, 1) and rep.selected == (1,) and rep.kept == (0, 1)
    assert repair_selection([], [], max_selected=8, keep_latest=3).kept == ()


def test_repair_enforces_budget_dropping_last_selected_first():
    # cost = 100 + 10 per kept turn; budget 150 allows 5 kept turns: latest {8, 9} + 3 selected.
    def cost(kept):
        return 100 + 10 * len(kept)

    rep = repair_selection([5, 1, 9, 3, 2], range(10), max_selected=8, keep_latest=2, cost=cost, budget=150)
    assert rep.selected == (5, 1, 9, 3)  # 9 is also a latest turn: kept, never dropped for the budget
    assert rep.over_budget == (2,)
    assert rep.kept == (1, 3, 5, 8, 9) and rep.cost == 150 and rep.fits


def test_repair_reports_unfixable_budget():
    rep = repair_selection(
        [0, 1], range(5), max_selected=8, keep_latest=2, cost=lambda k: 50 * len(k), budget=90
    )
    assert rep.selected == () and rep.over_budget == (0, 1)
    assert rep.kept == (3, 4) and rep.cost == 100 and not rep.fits


def test_repair_rejects_bad_parameters():
    with pytest.raises(ValueError, match="max_selected must be an integer >= 0, got -1"):
        repair_selection([], [0], max_selected=-1, keep_latest=1)
    with pytest.raises(ValueError, match=r"keep_latest must be an integer >= 0, got 1\.5"):
        repair_selection([], [0], max_selected=1, keep_latest=1.5)
    with pytest.raises(ValueError, match="both cost and budget"):
        repair_selection([], [0], max_selected=1, keep_latest=1, cost=len)


# ---------------------------------------------------------------------------------- parsing


def test_parse_selection_lines():
    text = (
        "<think>turn_7</think>ok <selection>\nturn_2: the city\n- turn_0\nturn_11 : x\nkeep turn_3\n\n"
        "turn_\n</selection> turn_5"
    )
    assert parse_selection(text) == [2, 0, 11, "keep turn_3", "turn_"]
    assert parse_selection("<selection></selection>") == []
    assert parse_selection("<selection>\nturn_4: cut") == [4]  # unterminated: to the end
    assert parse_selection("turn_1: no block\n\nturn_2") == ["turn_1: no block", "turn_2"]


def test_locate_finding_branches():
    call = '<tool_call>{"name": "search", "arguments": {"query": "Rile"}}</tool_call>'
    text = f"{SUM_OPEN} Tamo  works\nat Rile. {SUM_CLOSE}{call}"
    start, end, found = locate_finding(text)
    assert (start, end, found) == (0, len(text) - len(call), "Tamo works at Rile.")
    think = f"<think>{SUM_OPEN}no{SUM_CLOSE}</think>{SUM_OPEN}A is in B.{SUM_CLOSE}"
    assert locate_finding(think) == (
        len(think) - len(f"{SUM_OPEN}A is in B.{SUM_CLOSE}"),
        len(think),
        "A is in B.",
    )
    unterminated = f"{SUM_OPEN}A is in B. {call}"
    assert locate_finding(unterminated) == (0, len(f"{SUM_OPEN}A is in B. "), "A is in B.")
    closed_after_call = f"{SUM_OPEN}A{call}{SUM_CLOSE}"
    assert locate_finding(closed_after_call) == (0, len(SUM_OPEN) + 1, "A")
    assert locate_finding(f"  Rile is in Vosa.  {call}") == (2, 18, "Rile is in Vosa.")
    assert locate_finding(call) is None
    assert locate_finding(f"{SUM_OPEN}{'x' * 50}{SUM_CLOSE}", cap=10)[2] == "x" * 10
    assert locate_finding(f"{SUM_OPEN}{SUM_CLOSE}<answer>A</answer>")[2] == ""


def test_render_action():
    call = '<tool_call>{"name": "search", "arguments": {"query": "Rile", "k": 2}}</tool_call>'
    assert (
        render_action(f"{SUM_OPEN}x{SUM_CLOSE}{call}{call}")
        == "search(query=Rile, k=2); search(query=Rile, k=2)"
    )
    assert render_action("<tool_call>{oops</tool_call>") == "invalid tool call"
    assert render_action("<answer> Vosa </answer>") == "answer: Vosa"
    assert (
        render_action(f"{SUM_OPEN}fact{SUM_CLOSE} hmm", locate_finding(f"{SUM_OPEN}fact{SUM_CLOSE} hmm"))
        == "hmm"
    )
    assert render_action("") == "(empty)"
    assert len(render_action("word " * 100, cap=20)) <= 20


def test_semantic_topk_orders_by_similarity_then_index():
    vecs = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [0.6, 0.8]])
    assert semantic_topk(np.array([0.0, 1.0]), vecs, [3, 5, 7, 9], 3) == [7, 5, 9]
    with pytest.raises(ValueError, match=r"shape \(4, 2\) for 3 indices"):
        semantic_topk(np.array([0.0, 1.0]), vecs, [1, 2, 3], 1)


def test_make_context_validates_parameters():
    limits = LoopLimits(6, 512)
    with pytest.raises(ValueError, match=r"retrieval must be one of .* got 'bm25'"):
        make_context("memory", limits, {"retrieval": "bm25"})
    with pytest.raises(ValueError, match=r"observations must be one of .* got 'raw'"):
        make_context("memory", limits, {"observations": "raw"})
    with pytest.raises(ValueError, match="keep_latest must be an integer >= 1, got 0"):
        make_context("memory", limits, {"keep_latest": 0})
    assert make_context("memory", limits, {}).selection_budget == 1024


# ------------------------------------------------------------------------------------- loop


class Recorder(ExpertEngine):
    """The scripted expert as an engine that logs every prompt it is given (and the env at selections);
    ``selection_text`` replaces the expert's selections."""

    def __init__(self, renderer, selection_text=None):
        super().__init__(renderer.tokenizer, eos_id=renderer.eos_id, seed=0, noise=0.0)
        self.episode = None
        self.selection_text = selection_text
        self.log: list[tuple[list[int], list[int]]] = []
        self.env_at_selection: list[tuple[list[str], int]] = []

    def generate_requests(self, requests):
        out = []
        for req in requests:
            if self.episode.state.get("phase") == "selection":
                st = self.episode.env.state
                self.env_at_selection.append((list(st["searched"]), st["turn"]))
                if self.selection_text is not None:
                    req = replace(req, expert=lambda rng, noise: self.selection_text)
            gen = super().generate_requests([req])[0]
            self.log.append((list(req.prompt_ids), list(gen.ids)))
            out.append(gen)
        return out


def _run(renderer, selection_text=None, params=None, budget=BUDGET, max_turns=10):
    cls = get_env("lookup")
    task = cls.make_tasks(1, seed=0, split="train", **KNOBS)[0]
    ep = start_episode(cls(**KNOBS), task, renderer, uid="u", group_id="g")
    manager = make_context("memory", LoopLimits(max_turns, budget), params or {})
    engine = Recorder(renderer, selection_text)
    engine.episode = ep
    rollout = run_program(engine, episode_program(ep, manager, SamplingParams(max_new_tokens=NEW)))
    return rollout, ep, engine


def _decode(tok, ids):
    return tok.decode(ids, skip_special_tokens=True)


def test_loop_reconstructs_with_exact_prompts_spans_and_rollback(renderer, tok):
    rollout, ep, engine = _run(renderer)
    chain = ep.env.state["chain"]
    assert rollout.success and rollout.termination == "done"
    kinds = [s.kind for s in rollout.segments]
    assert kinds[:3] == ["normal", "selection", "normal"] and kinds[-1] == "normal"
    n_rec = kinds.count("selection")
    m = rollout.env["metrics"]
    assert m["splits"] == n_rec == m["rolled_back"] and m["split"] == 1.0 and m["segments"] == n_rec + 1
    # Every recorded prompt/response is exactly one the engine saw. The overflow turn of each
    # reconstruction is rolled back in the env but kept (Alg. 1), for its finding: one per reconstruction.
    recorded = [(t.prompt_ids, t.response_ids) for t in rollout.turns]
    assert all(pair in engine.log for pair in recorded)
    assert len(engine.log) == len(recorded)
    assert sum(bool(t.info.get("rolled_back")) for t in rollout.turns) == n_rec
    # Without keep_overflow_finding those turns are not recorded at all (the spec's literal reading).
    old, _, old_engine = _run(renderer, params={"keep_overflow_finding": False})
    assert len(old_engine.log) - len(old.turns) == n_rec and not any(
        t.info.get("rolled_back") for t in old.turns
    )
    # Rolled back: at each selection the env is as it was before the overflow turn (one search per turn).
    agent = [
        t for s in rollout.segments if s.kind == "normal" for t in s.turns if not t.info.get("rolled_back")
    ]
    assert ep.agent_turns == len(agent) == 5 and m["tool_turns"] == 4
    for searched, env_turns in engine.env_at_selection:
        assert env_turns == len(searched) and searched == chain[: len(searched)]
    # Spans: turn i's finding is about turn i-1's search; its action is search(chain[i]); selection spans.
    sources = 0
    for seg in rollout.segments:
        for k, turn in enumerate(seg.turns):
            covered = sorted((s.start, s.end) for s in turn.spans)
            assert covered[0][0] == 0 and covered[-1][1] == turn.num_response_tokens
            assert all(a[1] == b[0] for a, b in itertools.pairwise(covered))
            if seg.kind == "selection":
                assert [s.label for s in turn.spans] == ["selection"]
                continue
            by = {s.label: s for s in turn.spans}
            text = {lab: _decode(tok, turn.response_ids[s.start : s.end]) for lab, s in by.items()}
            if turn.info.get("rolled_back"):  # its finding completes the last record; its action is undone
                assert by["finding"].source_turn == sources - 1 and by["action"].source_turn is None
                assert turn.tool_calls == 0 and turn.observation is None
                continue
            if "finding" in by:
                assert by["finding"].source_turn == sources - 1
                assert text["finding"].startswith(SUM_OPEN) and text["finding"].endswith(SUM_CLOSE)
                assert f"{chain[sources - 1]} " in text["finding"]
            else:
                assert k == 0  # first turn of the rollout or of a rebuilt segment: no finding pending
            if sources < 4:
                assert (
                    by["action"].source_turn == sources and f'"query": "{chain[sources]}"' in text["action"]
                )
                assert turn.info["source_turn"] == sources
                sources += 1
            else:
                assert by["answer"].source_turn is None and text["answer"] == f"<answer>{chain[4]}</answer>"
    # Final segment: selected (chain turns picked by the expert) and the latest K=3 records.
    last = rollout.segments[-1]
    n_records = last.turns[0].info["source_turn"]
    assert last.info["kept_latest"] == list(range(max(0, n_records - 3), n_records))
    assert set(last.info["selected"]) == set(range(n_records))
    # Rows train every recorded token under its own context; echo credit and JSON round trip work.
    rows = build_rows([rollout])
    assert sum(r.num_trainable for r in rows) == rollout.num_response_tokens
    assert rollout_to_dict(rollout_from_dict(rollout_to_dict(rollout))) == rollout_to_dict(rollout)
    adv = get_estimator("echo")([Group("g", "t", [rollout])])
    assert len(adv[0]) == len(rollout.segments)


def test_rebuilt_context_renders_selected_findings_and_no_hint(renderer, tok):
    rollout, ep, _ = _run(renderer)
    seg = rollout.segments[2]
    st = ep.state[STATE_KEY]
    first = seg.turns[0]
    text = _decode(tok, first.prompt_ids)
    for i in seg.info["selected"] + seg.info["kept_latest"]:
        assert f'turn_{i}: action="{st.records[i].action}" | finding="{st.records[i].finding}"' in text
    assert text.count(ep.task.prompt) == 1 and HINT not in text and memory.CONTINUATION in text
    # x ⊕ [user: memory ⊕ continuation]: the prompt is a fresh render of the task messages + one message.
    user = text[text.index(memory.MEMORY_HEADER) : text.index(memory.CONTINUATION) + len(memory.CONTINUATION)]
    expected = renderer.initial_ids([*ep.messages, {"role": "user", "content": user}], tools=ep.tools)
    assert first.prompt_ids == expected
    # The selection prompt extends the working context it interrupts, token for token.
    sel = rollout.segments[1].turns[0]
    seg0_last = [t for t in rollout.segments[0].turns if not t.info.get("rolled_back")][-1]
    assert sel.prompt_ids[: len(seg0_last.prompt_ids) + seg0_last.num_response_tokens] == (
        seg0_last.prompt_ids + seg0_last.response_ids
    )


def test_full_observation_ablation_renders_observations(renderer, tok):
    rollout, ep, _ = _run(renderer, params={"observations": "full"}, budget=704)
    st = ep.state[STATE_KEY]
    seg = next(s for s in rollout.segments[1:] if s.kind == "normal")
    text = _decode(tok, seg.turns[0].prompt_ids)
    i = seg.info["kept_latest"][-1]
    assert f'turn_{i}: action="{st.records[i].action}" | observation="{st.records[i].observation}"' in text
    assert "finding=" not in text


def test_semantic_retrieval_uses_embeddings_and_no_selection_generation(renderer):
    calls = []

    def embed_fn(texts):
        calls.append(list(texts))
        # query [1, 0]; a record's vector is [1, 0] if it mentions the chain's first company else [0, 1]
        return np.array([[1.0, 0.0]] + [[1.0, 0.0] if company in t else [0.0, 1.0] for t in texts[1:]])

    cls = get_env("lookup")
    company = cls.make_tasks(1, seed=0, split="train", **KNOBS)[0].meta["chain"][1]
    rollout, _, _ = _run(
        renderer, params={"retrieval": "semantic", "max_selected": 1, "keep_latest": 1, "embed_fn": embed_fn}
    )
    assert "selection" not in [s.kind for s in rollout.segments]
    first = rollout.segments[1]
    n = len(calls[0]) - 1
    assert calls[0][0].startswith(cls.make_tasks(1, seed=0, split="train", **KNOBS)[0].prompt)
    hits = [i for i, t in enumerate(calls[0][1:]) if company in t]
    assert first.info["selected"] == hits[:1] and first.info["kept_latest"] == [n - 1]


def test_overlong_when_reconstructions_are_exhausted(renderer):
    rollout, _, _ = _run(renderer, params={"max_reconstructions": 0})
    assert rollout.termination == "overlong" and len(rollout.segments) == 1
    assert "max_reconstructions=0" in rollout.segments[0].info["overlong"]
    assert rollout.env["metrics"]["overlong"] == 1.0
    ok, _, _ = _run(renderer)
    adv = get_estimator("echo")([Group("g", "t", [rollout, ok])])
    assert all(not np.any(a) for seg in adv[0] for a in seg)


def test_selection_prompt_over_its_budget_is_overlong(renderer):
    rollout, _, _ = _run(renderer, params={"selection_budget": BUDGET})
    assert rollout.termination == "overlong" and "selection prompt" in rollout.segments[-1].info["overlong"]


def test_malformed_selection_keeps_only_latest(renderer):
    text = "<selection>\nturn_99: far\nall of them\nturn_0\nturn_0\n</selection>"
    rollout, _, _ = _run(renderer, selection_text=text, params={"keep_latest": 1})
    seg = rollout.segments[1]
    assert seg.info["repair"] == {
        "malformed": 1,
        "out_of_range": 1,
        "duplicates": 1,
        "over_cap": 0,
        "over_budget": 0,
    }
    assert rollout.segments[2].info["selected"] == [0]


def test_expert_program_rows_for_the_warm_start(renderer):
    """``train.recipes.expert_program_rows`` (the SFT hook for non-append contexts) records this protocol."""
    cfg = from_dict(
        {
            "env": {"name": "lookup", "knobs": KNOBS},
            "rollout": {
                "context": "memory",
                "context_budget": BUDGET,
                "max_new_tokens": NEW,
                "max_turns": 10,
            },
            "sft": {"demos": 2, "noise": 0.0},
        }
    )
    rows = expert_program_rows(cfg, renderer, renderer.tokenizer)
    rollout, _, _ = _run(renderer)
    first = [r for r in rows if r.rollout_index == 0]
    assert len(first) == len(rollout.segments)  # one row per segment: normal, selection, normal, ...
    sel = rollout.segments[1].turns[0]
    assert first[1].input_ids == sel.prompt_ids + sel.response_ids
    assert sum(first[1].trainable) == sel.num_response_tokens
    texts = [renderer.tokenizer.decode(r.input_ids) for r in first]
    assert memory.CONTINUATION in texts[2] and any(SUM_OPEN in t for t in texts)


@pytest.fixture
def one_thread():
    """Tiny matmuls on a shared 2-core machine: one torch thread avoids OpenMP spin contention."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_tiny_model_loop_records_what_the_model_saw(tok, renderer, one_thread):
    model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1))
    engine = HFEngine(model, tok, seed=0)
    seen: list[tuple[list[int], list[int]]] = []
    generate = engine.generate

    def logging_generate(prompts, params):
        gens = generate(prompts, params)
        seen.extend((list(p), list(g.ids)) for p, g in zip(prompts, gens, strict=True))
        return gens

    engine.generate = logging_generate
    cls = get_env("lookup")
    tasks = cls.make_tasks(2, seed=1, split="train", **KNOBS)
    eps = [start_episode(cls(**KNOBS), t, renderer, uid=f"u{i}", group_id="g") for i, t in enumerate(tasks)]
    torch.manual_seed(0)
    rollouts = run_episodes(
        engine,
        renderer,
        eps,
        SamplingParams(max_new_tokens=24),
        LoopLimits(4, 520),
        context="memory",
        context_params={"selection_tokens": 16, "max_reconstructions": 2},
    )
    assert any(len(r.segments) > 1 for r in rollouts)
    for r in rollouts:
        for seg in r.segments:
            for t in seg.turns:
                assert (t.prompt_ids, t.response_ids) in seen
                assert len(t.prompt_ids) + 24 <= 520 or seg.kind == "selection"
                assert sorted((s.start, s.end) for s in t.spans)[-1][1] == t.num_response_tokens
    # Every generation the model made is a recorded turn, or one of the rolled-back overflow turns.
    kept = sum(bool(t.info.get("rolled_back")) for r in rollouts for t in r.turns)
    assert len(seen) == sum(r.num_turns + r.env["metrics"]["rolled_back"] for r in rollouts) - kept
