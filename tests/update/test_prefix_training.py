"""Prefix-shared training (train/update/prefix.py): the trie plan and the micro-batches by hand, and
per-token log-probs, every parameter's gradient, a whole PPO step and the recomputed pi_old equal to the
plain per-row update on Llama-, Qwen2- and Qwen3-shaped models, for rows that share nothing, a whole
prompt, or prefixes at several depths (GRPO groups, RTPO's trunk and siblings, a subagent fork)."""

from __future__ import annotations

import dataclasses
import random
import warnings

import pytest
import torch

from helpers.tiny_decoders import tiny_decoder
from horizonrl.errors import ConfigError
from horizonrl.train.update.batching import SHARE_ALL, collate, loss_positions, token_logprobs
from horizonrl.train.update.chunks import forward_cost, forwarded_tokens, prefix_chunks, update_chunks
from horizonrl.train.update.lean import ForwardOptions, enable_gradient_checkpointing
from horizonrl.train.update.ppo import UpdateSettings, ppo_update, score_rows
from horizonrl.train.update.prefix import Node, PrefixCost, plan_prefix, prefix_cost, prefix_support
from horizonrl.trajectory import Row

pytestmark = pytest.mark.usefixtures("one_thread")

V = 120  # the tiny decoders' vocabulary


def _row(ids, prompt: int, rollout: int, rng: random.Random, temp: float = 1.0) -> Row:
    n = len(ids)
    trainable = [j >= prompt for j in range(n)]
    return Row(
        input_ids=list(ids),
        trainable=trainable,
        old_logprobs=[-rng.uniform(0.5, 4.0) if t else 0.0 for t in trainable],
        advantages=[rng.uniform(-1, 1) if t else 0.0 for t in trainable],
        turn_ids=[0 if t else -1 for t in trainable],
        rollout_index=rollout,
        segment_index=0,
        temperatures=[temp] * n,
    )


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, V) for _ in range(n)]


def nothing_shared(rng: random.Random) -> list[Row]:
    """Four rows whose first tokens differ."""
    return [_row([3 + g, *_tokens(rng, 8 + 3 * g)], 4, g, rng) for g in range(4)]


def grpo_group(rng: random.Random) -> list[Row]:
    """Four completions of one prompt (different lengths and sampling temperatures)."""
    prompt = [2, *_tokens(rng, 11)]
    return [
        _row(prompt + _tokens(rng, 4 + 3 * g), len(prompt), g, rng, temp=(1.0, 0.7)[g % 2]) for g in range(4)
    ]


def several_depths(rng: random.Random) -> list[Row]:
    """RTPO: a trunk's turn-2 row (a prefix of its turn-3 row) and three siblings forked at the turn-3
    boundary; a subagent fork: a parent and two children that share its context and then two tokens;
    an unrelated row."""
    trunk = [2, *_tokens(rng, 30)]
    rows = [_row(trunk[:20], 14, 0, rng), _row(trunk, 24, 0, rng)]
    rows += [_row(trunk[:24] + _tokens(rng, 5 + k), 24, 1 + k, rng, temp=0.8) for k in range(3)]
    parent = [2, 7, *_tokens(rng, 15)]
    rows.append(_row(parent + _tokens(rng, 6), 16, 4, rng))
    rows += [_row([*parent, 5, 5, *_tokens(rng, 4 + k)], 18, 5 + k, rng) for k in range(2)]
    rows.append(_row([9, *_tokens(rng, 10)], 4, 7, rng))
    return rows


CASES = {"nothing_shared": nothing_shared, "grpo_group": grpo_group, "several_depths": several_depths}


def test_the_plan_by_hand():
    seqs = [[1, 2, 3, 4], [9, 9], [1, 2, 3, 5], [1, 2, 6]]
    plan = plan_prefix(seqs, SHARE_ALL)
    # Trie: 1 2 (rows 0 2 3) -> 3 (rows 0 2) -> 4 | 5; 1 2 -> 6; and 9 9 alone.
    assert plan.nodes == (Node(-1, 0, 2, (0, 2, 3)), Node(0, 2, 3, (0, 2)))
    assert plan.tail_parent == (1, -1, 1, 0) and plan.tail_start == (3, 0, 3, 2)
    assert plan.tokens([4, 2, 4, 3]) == 8  # 1 2 3 4 5 6 9 9: every distinct trie node once
    # A call worth 3 tokens: "1 2" saves 2 x 2 = 4 and is shared, "3" saves 1 and is not.
    plan = plan_prefix(seqs, PrefixCost(per_token=1.0, per_pair=0.0, per_call=3.0))
    assert plan.nodes == (Node(-1, 0, 2, (0, 2, 3)),)
    assert plan.tail_parent == (0, -1, 0, 0) and plan.tail_start == (2, 0, 2, 2)
    assert plan.tokens([4, 2, 4, 3]) == 2 + 3 * 2 + 2  # the shared "1 2", three tails of 2 padded, "9 9"


def test_a_row_inside_another_has_no_tail():
    seqs = [[1, 2, 3], [1, 2, 3, 4, 5], [1, 2, 3, 4, 6]]
    plan = plan_prefix(seqs, SHARE_ALL)
    assert plan.nodes == (Node(-1, 0, 3, (0, 1, 2)), Node(0, 3, 4, (1, 2)))
    assert plan.tail_start[0] == 3 and plan.tail_parent[0] == 0  # zero width: all of it is shared
    assert plan.tokens([3, 5, 5]) == 6
    # By hand (per_token 1, per_pair 0, per_call 0): node tokens 3 + 1, tails 2 x 1.
    assert plan.cost([3, 5, 5], SHARE_ALL) == 6


def test_micro_batches_follow_the_budget_and_the_cost():
    rng = random.Random(0)
    rows = grpo_group(rng) + several_depths(rng)
    seqs = [r.input_ids for r in rows]
    chunks = prefix_chunks(seqs, SHARE_ALL, 40)
    assert sorted(i for pos, _ in chunks for i in pos) == list(range(len(rows)))
    for pos, plan in chunks:
        unique = plan_prefix([seqs[i] for i in pos], SHARE_ALL).tokens([len(seqs[i]) for i in pos])
        assert unique <= 40 or len(pos) == 1 or plan.tokens([len(seqs[i]) for i in pos]) > unique - 1
    # A group: 8 rows sharing a 10-token prompt, 10 tokens of their own each.
    group = [[1, *range(2, 11), *range(100 * r, 100 * r + 10)] for r in range(1, 9)]
    linear = PrefixCost(per_token=10.0, per_pair=1.0, per_call=0.0)
    [(order, plan)] = prefix_chunks(group, linear, 1000)
    # By hand: the prompt (10 tokens, no past) 10 x (10 + 10) = 200; the tails 8 x 10 x (10 + 20) = 2400;
    # plain: 8 rows x 20 x (10 + 20) = 4800.
    assert forward_cost(group, [(order, plan)], linear) == 200 + 2400
    assert forward_cost(group, [(order, None)], linear) == 4800
    assert forwarded_tokens(group, [(order, plan)]) == 90 and forwarded_tokens(group, [(order, None)]) == 160
    assert update_chunks(group, 1000, cost=linear) == [(order, plan)]
    # A forward call worth more than the 70 tokens sharing saves: the plain micro-batch.
    dear = dataclasses.replace(linear, per_call=10_000.0)
    assert update_chunks(group, 1000, cost=dear) == update_chunks(group, 1000)
    # Rows that share nothing: the plain micro-batches (sorted by length, which pad least).
    assert update_chunks([*seqs[:1], [7, 7, 7]], 1000, cost=linear)[0][1] is None
    assert update_chunks([], 1000, cost=linear) == []


def _logprobs_and_grads(model, rows, options, plan=None):
    model.zero_grad(set_to_none=True)
    batch = collate(rows)
    lp = token_logprobs(model, batch, options, plan)
    weights = torch.linspace(-1, 1, lp.numel()).reshape(lp.shape) * batch.mask
    (lp * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach(), grads


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("chunk", [0, 7])
def test_logprobs_and_gradients_equal_the_plain_forward(family, case, chunk):
    """float32: per-token log-probs within 2e-5 nats, every parameter's gradient within 1e-5 + 1e-4 rel."""
    rows = CASES[case](random.Random(len(case)))
    model = tiny_decoder(family)
    options = ForwardOptions(chunk_tokens=chunk, tree=True)
    plan = plan_prefix([r.input_ids for r in rows], SHARE_ALL)
    assert plan.shares == (case != "nothing_shared")
    ref, gref = _logprobs_and_grads(model, rows, ForwardOptions(chunk_tokens=chunk))
    got, ggot = _logprobs_and_grads(model, rows, options, plan)
    valid = collate(rows).attention_mask[:, 1:].bool()
    assert torch.allclose(got[valid], ref[valid], atol=2e-5), (got - ref).abs().max()
    if plan.shares:  # positions without a target are 0 (the plain full-logits path leaves junk there)
        assert float(got[~valid].abs().max()) == 0.0
    assert set(ggot) == set(gref) and len(gref) == len(list(model.parameters()))
    for name, g in gref.items():
        assert torch.allclose(ggot[name], g, atol=1e-5, rtol=1e-4), name


def test_bf16_autocast_matches_the_plain_bf16_forward():
    rows = several_depths(random.Random(3))
    model = tiny_decoder("llama")
    plan = plan_prefix([r.input_ids for r in rows], SHARE_ALL)
    ref, _ = _logprobs_and_grads(model, rows, ForwardOptions(16, precision="bf16"))
    got, _ = _logprobs_and_grads(model, rows, ForwardOptions(16, precision="bf16", tree=True), plan)
    valid = collate(rows).attention_mask[:, 1:].bool()
    d = (got - ref)[valid]
    assert float(d.abs().max()) < 5e-2 and abs(float(d.mean())) < 5e-3


def test_lora_adapters_get_the_plain_gradients():
    from types import SimpleNamespace

    from horizonrl.models.lora import apply_lora

    rows = several_depths(random.Random(5))
    model = tiny_decoder("qwen2")
    torch.manual_seed(0)
    cfg = SimpleNamespace(lora_r=4, lora_alpha=8, lora_dropout=0.0, lora_target_modules="all-linear")
    apply_lora(model, cfg)
    with torch.no_grad():  # B starts at zero: move it so that the adapters change the function
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.normal_(0, 0.1)
    plan = plan_prefix([r.input_ids for r in rows], SHARE_ALL)
    ref, gref = _logprobs_and_grads(model, rows, ForwardOptions(8))
    got, ggot = _logprobs_and_grads(model, rows, ForwardOptions(8, tree=True), plan)
    valid = collate(rows).attention_mask[:, 1:].bool()
    assert torch.allclose(got[valid], ref[valid], atol=2e-5)
    assert gref and all(".lora_" in n for n in gref)
    for name, g in gref.items():
        assert torch.allclose(ggot[name], g, atol=1e-5, rtol=1e-4), name


def test_a_whole_ppo_step_equals_the_plain_step():
    rng = random.Random(7)
    rows = grpo_group(rng) + several_depths(rng)
    for i, r in enumerate(rows):
        r.rollout_index = i
    free = PrefixCost(per_token=1.0, per_pair=0.0)
    out = {}
    for mode in ("off", "auto"):
        model = tiny_decoder("llama")
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        s = UpdateSettings(
            "token-mean", tree_training=mode, mini_batches=2, micro_batch_tokens=96, kl_coef=0.1
        )
        gen = torch.Generator().manual_seed(1)
        with pytest.MonkeyPatch.context() as mp:  # share every prefix, whatever the tiny shapes pay
            mp.setattr("horizonrl.train.update.forward.prefix_cost", lambda m: free)
            m = ppo_update(
                model, opt, None, rows, s, generator=gen, device="cpu", ref_model=tiny_decoder("llama", 1)
            )
        out[mode] = (torch.cat([p.detach().flatten() for p in model.parameters()]), m)
    (p_off, m_off), (p_on, m_on) = out["off"], out["auto"]
    assert not torch.equal(
        p_off, torch.cat([p.detach().flatten() for p in tiny_decoder("llama").parameters()])
    )
    assert torch.allclose(p_on, p_off, atol=1e-5)
    assert m_on["train/loss"] == pytest.approx(m_off["train/loss"], rel=1e-4)
    assert m_on["train/kl"] == pytest.approx(m_off["train/kl"], rel=1e-4) and m_off["train/kl"] > 0
    assert m_on["train/ratio_geomean"] == pytest.approx(m_off["train/ratio_geomean"], rel=1e-5)
    # Both count the rows' own tokens; only the shared update forwards fewer than them.
    own = sum(len(r) for r in rows)
    assert m_on["train/row_tokens"] == m_off["train/row_tokens"] == own
    assert m_on["train/forwarded_tokens"] < own <= m_off["train/forwarded_tokens"]


def test_the_recomputed_pi_old_equals_the_plain_scores():
    rows = several_depths(random.Random(1))
    model = tiny_decoder("qwen3")
    plain = score_rows(model, rows, device="cpu", pad_id=0, micro_batch_tokens=4096)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("horizonrl.train.update.forward.prefix_cost", lambda m: SHARE_ALL)
        shared = score_rows(
            model, rows, device="cpu", pad_id=0, micro_batch_tokens=4096, forward=ForwardOptions(tree=True)
        )
    for r, a, b in zip(rows, plain, shared, strict=True):
        read = torch.tensor(r.trainable[1:])  # the positions a loss reads; the head skips the prompt
        assert torch.allclose(a[read], b[read], atol=2e-5)
        assert not bool(b[~read].any()) and bool(a[~read].all())


def test_the_head_runs_only_where_a_loss_reads():
    """``read`` leaves the LM head out at prompt and tool positions: the read ones equal the plain
    forward, the others are 0, on the chunked and on the shared path; a generated turn's untrainable
    tokens (``turn_ids >= 0``, averaged by turn-level ratios) are read too."""
    rng = random.Random(4)
    rows = grpo_group(rng)
    rows[0].trainable[-3:] = [False] * 3  # generated (turn id 0) but masked, e.g. a truncated turn
    model = tiny_decoder("llama")
    batch = collate(rows)
    read = loss_positions(batch)
    last = slice(len(rows[0]) - 4, len(rows[0]) - 1)  # target j is token j + 1
    assert bool(read[0, last].all()) and not bool(batch.mask[0, last].any())
    with torch.no_grad():
        plain = token_logprobs(model, batch)
        seqs = [r.input_ids for r in rows]
        for plan in (None, plan_prefix(seqs, SHARE_ALL)):
            got = token_logprobs(model, batch, ForwardOptions(chunk_tokens=5), plan, read=read)
            assert torch.allclose(got[read], plain[read], atol=2e-5)
            assert not bool(got[~read].any())


def test_models_that_cannot_share_train_every_row_on_its_own(monkeypatch):
    monkeypatch.setattr("horizonrl.train.update.prefix._WARNED", set())  # once per reason and process
    model = tiny_decoder("llama")
    model.config._attn_implementation = "flash_attention_2"
    assert "attention implementation" in prefix_support(model)
    with pytest.warns(UserWarning, match="no shared prefixes"):
        assert prefix_cost(model) is None
    sliding = tiny_decoder("llama")
    sliding.config.layer_types = ["sliding_attention", "full_attention"]
    assert "sliding" in prefix_support(sliding)
    assert prefix_support(tiny_decoder("mistral")) is None  # Mistral without a window is full attention


def test_gradient_checkpointing_trains_on_the_plain_path_with_a_warning(monkeypatch):
    monkeypatch.setattr("horizonrl.train.update.forward._WARNED", set())  # once per reason and process
    rows = grpo_group(random.Random(2))
    model = tiny_decoder("llama").train()
    enable_gradient_checkpointing(model)
    s = UpdateSettings("token-mean", tree_training="auto", micro_batch_tokens=4096)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(UserWarning, match="gradient_checkpointing"):
        m = ppo_update(model, opt, None, rows, s, generator=torch.Generator().manual_seed(0), device="cpu")
    assert m["train/forwarded_tokens"] >= m["train/row_tokens"]


class _DropsTheCache(torch.nn.Module):
    """A model whose forward ignores the keys and values it is given: refused, never trained on."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = tiny_decoder("llama")
        self.config = self.inner.config

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def set_output_embeddings(self, head):
        self.inner.set_output_embeddings(head)

    def forward(self, input_ids, position_ids=None, cache=None, **kw):
        return self.inner(input_ids=input_ids, position_ids=position_ids, **kw)


def test_a_model_that_drops_the_shared_keys_is_refused():
    rows = grpo_group(random.Random(4))
    batch = collate(rows)
    plan = plan_prefix([r.input_ids for r in rows], SHARE_ALL)
    with warnings.catch_warnings(), pytest.raises(ConfigError, match=r"algo\.tree_training=off"):
        token_logprobs(_DropsTheCache(), batch, ForwardOptions(tree=True), plan)


def test_update_settings_validate_tree_training():
    with pytest.raises(ValueError, match="tree_training='on'"):
        UpdateSettings("token-mean", tree_training="on")
    assert dataclasses.replace(UpdateSettings("token-mean"), tree_training="auto").forward.tree


def test_ccpo_context_states_through_shared_prefixes_equal_the_plain_ones():
    from horizonrl.train.methods.ccpo import last_token_states

    prompts = [r.input_ids for r in several_depths(random.Random(6))]
    model = tiny_decoder("qwen2")
    plain = last_token_states(model, prompts, token_budget=10_000)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("horizonrl.train.methods.ccpo.prefix_cost", lambda m: SHARE_ALL)
        shared = last_token_states(model, prompts, token_budget=10_000, share=True)
    assert shared.shape == plain.shape == (len(prompts), 48)
    assert abs(shared - plain).max() < 1e-5


@pytest.mark.parametrize("trainer", ["rtpo", "group"])
def test_a_seeded_run_ends_at_the_same_weights_with_and_without_sharing(trainer, tiny_model_dir, tmp_path):
    """Two RTPO (trunk and siblings) or GRPO (groups) steps of the tiny model, every prefix shared, from
    the same seed: the same samples, the same weights to float rounding, fewer tokens forwarded."""
    from horizonrl.config import load_config
    from horizonrl.train.records.metrics import read_metrics
    from horizonrl.train.trainers.registry import make_trainer

    out = {}
    for mode in ("off", "auto"):
        cfg = load_config(
            None,
            [
                f"model.path={tiny_model_dir}",
                "env.name=arithmetic",
                "env.knobs={n_ops: 2, max_operand: 9}",
                "env.train_tasks=40",
                "env.test_tasks=2",
                "rollout.tasks_per_step=2",
                "rollout.group_size=4",
                "rollout.max_new_tokens=16",
                "rollout.max_turns=3",
                "optim.lr=1e-3",
                "train.eval_at_start=false",
                f"train.eval_every={10**6}",
                "train.progress=false",
                f"train.trainer={trainer}",
                "train.steps=2",
                f"algo.tree_training={mode}",
                f"train.out_dir={tmp_path / mode}",
                *(["train.trainer_params.siblings=3"] if trainer == "rtpo" else []),
            ],
        )
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("horizonrl.train.update.prefix.CALL_FLOPS_PER_LAYER", 0.0)
            run = make_trainer(cfg)
            run.fit()
        weights = torch.cat([p.detach().flatten() for p in run.train_model.parameters()])
        run.close()
        out[mode] = (weights, [m for m in read_metrics(tmp_path / mode) if "train/row_tokens" in m])
    (w_off, m_off), (w_on, m_on) = out["off"], out["auto"]
    assert torch.allclose(w_on, w_off, atol=1e-5), (w_on - w_off).abs().max()
    assert [m["train/row_tokens"] for m in m_on] == [m["train/row_tokens"] for m in m_off]
    assert sum(m["train/forwarded_tokens"] for m in m_on) < sum(m["train/forwarded_tokens"] for m in m_off)


def _counting(fn, calls: list, tag):
    """``fn`` that appends ``tag`` to ``calls`` on every call."""

    def wrapped(*a, **k):
        calls.append(tag)
        return fn(*a, **k)

    return wrapped


def test_the_sft_warm_start_shares_the_demonstrations_prompt():
    """SFT (train/warmstart/sft.py) on demonstrations that share a 60-token system/tool prompt: with
    sharing the prompt goes through the shared-prefix forward, and the losses and the weights after two
    epochs equal the plain SFT's to float rounding."""
    from horizonrl.train.update import batching
    from horizonrl.train.warmstart.sft import sft_train

    rng = random.Random(3)
    prompt = [2, *_tokens(rng, 59)]
    rows = [_row(prompt + _tokens(rng, 6 + k), len(prompt), k, rng) for k in range(6)]
    out, calls = {}, []
    for share in (False, True):
        model = tiny_decoder("qwen2")
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("horizonrl.train.update.prefix.CALL_FLOPS_PER_LAYER", 0.0)
            mp.setattr(batching, "shared_logprobs", _counting(batching.shared_logprobs, calls, share))
            losses = sft_train(
                model,
                rows,
                epochs=2,
                batch_size=3,
                lr=1e-3,
                seed=0,
                device=torch.device("cpu"),
                share_prefix=share,
            )
        out[share] = (losses, torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert calls and set(calls) == {True}  # the shared path ran, and only with sharing on
    (l_off, w_off), (l_on, w_on) = out[False], out[True]
    assert len(l_on) == len(l_off) == 4
    assert l_on == pytest.approx(l_off, rel=1e-5)
    assert torch.allclose(w_on, w_off, atol=1e-5), (w_on - w_off).abs().max()
