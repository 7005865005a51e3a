"""Shared-prefix (tree) training: the forest layout by hand, and per-token log-probs, gradients and a
whole PPO step equal to the unshared update on GRPO groups, RTPO siblings and a fork."""

from __future__ import annotations

import dataclasses
import random
import warnings

import pytest
import torch

from horizonrl.errors import ConfigError
from horizonrl.models.tiny import TinyModelConfig, build_tiny_model
from horizonrl.train.update.batching import collate, token_logprobs
from horizonrl.train.update.chunks import forward_cost, forwarded_tokens, tree_chunks, update_chunks
from horizonrl.train.update.lean import ForwardOptions
from horizonrl.train.update.ppo import UpdateSettings, ppo_update, score_rows
from horizonrl.train.update.tree import (
    TreeCost,
    build_forest,
    plan_trees,
    tree_cost,
    tree_support,
    tree_tokens,
)
from horizonrl.trajectory import Row

# Sharing is always worth it under this cost (no attention term): every row with a common prefix joins.
FREE = TreeCost(per_token=1.0, per_pair=0.0)


class _Tok:
    """The little a tiny model needs of a tokenizer: a vocabulary size and special ids."""

    def __init__(self, n: int = 64) -> None:
        self.n = n
        self.eos_token_id, self.pad_token_id, self.bos_token_id = 1, 0, 2

    def __len__(self) -> int:
        return self.n


def _model(attn: str = "sdpa", seed: int = 0) -> torch.nn.Module:
    m = build_tiny_model(
        _Tok(),
        TinyModelConfig(
            hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64, seed=seed
        ),
    )
    m.config._attn_implementation = attn
    return m


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
    return [rng.randrange(3, 64) for _ in range(n)]


def grpo_group(rng: random.Random) -> list[Row]:
    """Four completions of one prompt (different lengths and sampling temperatures)."""
    prompt = [2, *_tokens(rng, 11)]
    return [
        _row(prompt + _tokens(rng, 4 + 3 * g), len(prompt), g, rng, temp=(1.0, 0.7)[g % 2]) for g in range(4)
    ]


def rtpo_siblings(rng: random.Random) -> list[Row]:
    """A trunk's turn-3 row and three siblings forked at that boundary: they share the trunk's context,
    and the turn-2 row is a prefix of the turn-3 context (the exact contexts extend each other)."""
    trunk = [2, *_tokens(rng, 30)]
    turn2 = _row(trunk[:20], 14, 0, rng)
    rows = [turn2, _row(trunk, 24, 0, rng)]
    rows += [_row(trunk[:24] + _tokens(rng, 5 + k), 24, 1 + k, rng) for k in range(3)]
    return rows


def fork(rng: random.Random) -> list[Row]:
    """A parent context, two subagents that start from it, and an unrelated row (its own tree)."""
    parent = [2, *_tokens(rng, 15)]
    rows = [_row(parent + _tokens(rng, 6), 16, 0, rng)]
    rows += [_row([*parent, 5, 5, *_tokens(rng, 4 + k)], 18, 1 + k, rng) for k in range(2)]
    rows.append(_row([2, 9, *_tokens(rng, 10)], 4, 3, rng))
    return rows


CASES = {"grpo_group": grpo_group, "rtpo_siblings": rtpo_siblings, "fork": fork}


def test_forest_layout_by_hand():
    rows = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 6], [1, 2, 5, 0], [7, 8, 0, 0]])
    f = build_forest(rows, [4, 4, 3, 2], [3, 1])
    # Tree 0: nodes 1 2 3 4 | 6 | 5, positions their depths; tree 1: 7 8, padded to 6.
    assert f.input_ids.tolist() == [[1, 2, 3, 4, 6, 5], [7, 8, 0, 0, 0, 0]]
    assert f.position_ids.tolist() == [[0, 1, 2, 3, 3, 2], [0, 1, 0, 0, 0, 0]]
    assert f.ends.tolist() == [[6, 6, 5, 4, 5, 6], [2, 2, 0, 0, 0, 0]]
    assert f.tokens == 8
    assert f.where.tolist() == [[0, 1, 2, 3], [0, 1, 2, 4], [0, 1, 5, 0], [6, 7, 6, 6]]
    see = f.attention_mask("sdpa", torch.float32)[:, 0]
    # node 4 (token 6) sees the shared 1 2 3 and itself, not 4; node 5 (token 5) sees 1 2 and itself.
    assert torch.nonzero(see[0, 4]).flatten().tolist() == [0, 1, 2, 4]
    assert torch.nonzero(see[0, 5]).flatten().tolist() == [0, 1, 5]
    assert torch.nonzero(see[0, 3]).flatten().tolist() == [0, 1, 2, 3]
    assert torch.nonzero(see[1, 1]).flatten().tolist() == [0, 1]
    assert torch.nonzero(see[1, 4]).flatten().tolist() == [4]  # padding sees only itself
    eager = f.attention_mask("eager", torch.float32)
    assert torch.equal(eager == 0, see.unsqueeze(1))


def test_forest_mask_is_the_ancestor_relation_of_random_tries():
    """Any row order: a node sees exactly the tokens before it in every row that holds it."""
    rng = random.Random(3)
    for _ in range(20):
        seqs = [[rng.randrange(3) for _ in range(rng.randrange(1, 7))] for _ in range(6)]
        T = max(map(len, seqs))
        ids = torch.tensor([s + [0] * (T - len(s)) for s in seqs])
        f = build_forest(ids, [len(s) for s in seqs], [6])
        see = f.attention_mask("sdpa", torch.float32)[0, 0]
        want = torch.zeros_like(see)
        for b, s in enumerate(seqs):
            path = f.where[b, : len(s)]
            assert f.input_ids[0, path].tolist() == s
            assert f.position_ids[0, path].tolist() == list(range(len(s)))
            for j in range(len(s)):
                want[path[j], path[: j + 1]] = True
        n = f.tokens
        assert torch.equal(see[:n, :n], want[:n, :n])


def test_plan_trees_joins_rows_that_share_and_pay():
    seqs = [[1, 2, 3, 4], [9, 9], [1, 2, 3, 5], [1, 2, 6]]
    assert plan_trees(seqs, FREE, 100) == [[0, 2, 3], [1]]
    assert tree_tokens(seqs, [0, 2, 3]) == 6
    # Under a dense mask whose pairs cost 10: [1,2,3,5] joins (tree 4 -> 5: 1 + 10 * (25 - 16) = 91 <
    # alone 4 + 160), [1,2,6] does not (tree 5 -> 6: 1 + 10 * (36 - 25) = 111 > alone 3 + 90).
    assert plan_trees(seqs, TreeCost(per_token=1.0, per_pair=10.0), 100) == [[0, 2], [3], [1]]
    # The budget caps a tree's size.
    assert plan_trees(seqs, FREE, 5) == [[0, 2], [3], [1]]


def test_tree_chunks_cover_every_row_once_and_respect_the_budget():
    rng = random.Random(0)
    rows = grpo_group(rng) + rtpo_siblings(rng) + fork(rng)
    seqs = [r.input_ids for r in rows]
    chunks = tree_chunks(seqs, FREE, 80)
    assert sorted(i for pos, _ in chunks for i in pos) == list(range(len(rows)))
    for pos, trees in chunks:
        assert sum(trees) == len(pos)
        sizes, start = [], 0
        for n in trees:
            sizes.append(tree_tokens(seqs, pos[start : start + n]))
            start += n
        assert max(sizes) * len(sizes) <= 80 or len(sizes) == 1


def _logprobs_and_grads(model, rows, trees=None):
    model.zero_grad(set_to_none=True)
    batch = collate(rows)
    lp = token_logprobs(model, batch, ForwardOptions(tree=trees is not None), trees)
    weights = torch.linspace(-1, 1, lp.numel()).reshape(lp.shape) * batch.mask
    (lp * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach(), batch.mask, grads


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_tree_logprobs_and_gradients_equal_the_unshared_forward(case, attn):
    rng = random.Random(hash(case) % 1000)
    rows = CASES[case](rng)
    model = _model(attn)
    model.eval()  # dropout off: both paths compute one function
    [(order, trees)] = tree_chunks([r.input_ids for r in rows], FREE, 10_000)
    rows = [rows[i] for i in order]
    assert max(trees) > 1
    ref, _, gref = _logprobs_and_grads(model, rows)
    got, _, ggot = _logprobs_and_grads(model, rows, trees)
    valid = collate(rows).attention_mask[:, 1:].bool()
    assert torch.allclose(got[valid], ref[valid], atol=2e-5), (got - ref).abs().max()
    for name, g in gref.items():
        assert torch.allclose(ggot[name], g, atol=1e-5, rtol=1e-4), name


def test_a_whole_ppo_step_with_trees_equals_the_plain_step():
    rng = random.Random(7)
    rows = grpo_group(rng) + rtpo_siblings(rng) + fork(rng)
    for i, r in enumerate(rows):
        r.rollout_index = i
    params = {}
    for mode in ("off", "auto"):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        s = UpdateSettings(
            "token-mean", tree_training=mode, mini_batches=2, micro_batch_tokens=96, kl_coef=0.1
        )
        gen = torch.Generator().manual_seed(1)
        m = ppo_update(model, opt, None, rows, s, generator=gen, device="cpu", ref_model=_model(seed=1))
        params[mode] = (torch.cat([p.detach().flatten() for p in model.parameters()]), m)
    (p_off, m_off), (p_on, m_on) = params["off"], params["auto"]
    assert not torch.equal(p_off, torch.cat([p.detach().flatten() for p in _model().parameters()]))
    assert torch.allclose(p_on, p_off, atol=1e-5)
    assert m_on["train/loss"] == pytest.approx(m_off["train/loss"], rel=1e-4)
    assert m_on["train/kl"] == pytest.approx(m_off["train/kl"], rel=1e-4) and m_off["train/kl"] > 0


def test_score_rows_with_trees_equals_the_plain_scores():
    rows = rtpo_siblings(random.Random(1))
    model = _model()
    plain = score_rows(model, rows, device="cpu", pad_id=0, micro_batch_tokens=4096)
    tree = score_rows(
        model, rows, device="cpu", pad_id=0, micro_batch_tokens=4096, forward=ForwardOptions(tree=True)
    )
    for a, b in zip(plain, tree, strict=True):
        assert torch.allclose(a, b, atol=2e-5)


def test_the_update_forwards_fewer_tokens_with_trees():
    rows = rtpo_siblings(random.Random(2))
    cost = tree_cost(_model())
    seqs = [r.input_ids for r in rows]
    [(pos, trees)] = update_chunks(seqs, 4096, cost=cost)
    assert trees == [len(rows)]  # one trunk: every row shares its start
    assert tree_tokens(seqs, pos) == 31 + 5 + 6 + 7  # the turn-3 context plus three sibling suffixes
    assert sum(map(len, seqs)) == 20 + 31 + 29 + 30 + 31


def test_trees_are_kept_only_where_they_save_tokens():
    seqs = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7, 8], [1, 9, 9, 9, 9, 9]]
    assert tree_chunks(seqs, FREE, 100) == [([0, 1, 2], [3])]  # one tree: 6 + 2 + 5 nodes
    assert forwarded_tokens(seqs, [([0, 1, 2], None)]) == 18  # 3 rows x 6
    assert forwarded_tokens([*seqs[:2], [1, 2]], [([0, 1, 2], None)], packed=True) == 14
    assert forwarded_tokens(seqs, [([0, 1], [2]), ([2], [1])]) == 8 + 6
    assert forwarded_tokens(seqs, [([0, 1, 2], [2, 1])]) == 2 * 8  # two trees padded to the larger
    assert update_chunks(seqs, 100, cost=FREE) == [([0, 1, 2], [3])]  # 13 <= 0.95 x 18
    # Two rows of 20 sharing one token: the tree's 39 tokens save under 5 % of 40, so the plain path.
    few = [[1, *range(100, 119)], [1, *range(200, 219)]]
    assert forwarded_tokens(few, tree_chunks(few, FREE, 100)) == 39
    assert update_chunks(few, 100, cost=FREE) == update_chunks(few, 100) == [([0, 1], None)]


def test_trees_are_chosen_by_cost_not_tokens():
    # A group: 8 rows sharing a 10-token prompt, each with 10 tokens of its own.
    seqs = [[1, *range(2, 11), *range(100 * r, 100 * r + 10)] for r in range(1, 9)]
    tree = [(list(range(8)), [8])]  # one tree of 10 + 8 x 10 = 90 nodes
    plain = [(list(range(8)), None)]  # 8 rows x 20
    assert tree_tokens(seqs, tree[0][0]) == 90
    linear = TreeCost(per_token=10.0, per_pair=1.0)
    # By hand: tree 90 x 10 + 90^2 = 9000; plain 8 x (20 x 10 + 20^2) = 4800; packed 160 x 10 + 160^2.
    assert forward_cost(seqs, tree, linear) == 9000
    assert forward_cost(seqs, plain, linear) == 4800
    assert forward_cost(seqs, plain, linear, packed=True) == 160 * 10 + 160**2
    # 90 tokens instead of 160 would pass a token count; the dense mask's attention makes it dearer.
    assert forwarded_tokens(seqs, tree) <= 0.95 * forwarded_tokens(seqs, plain)
    assert update_chunks(seqs, 1000, cost=linear)[0][1] is None
    # A model whose tokens cost much more than its pairs (a wide layer): the tree pays.
    wide = TreeCost(per_token=1000.0, per_pair=1.0)
    assert forward_cost(seqs, tree, wide) < 0.95 * forward_cost(seqs, plain, wide)
    assert update_chunks(seqs, 1000, cost=wide) == [(sorted(range(8), key=lambda i: seqs[i]), [8])]


def test_models_that_cannot_take_a_tree_mask_train_without_trees():
    model = _model("flash_attention_2")
    assert "attention implementation" in tree_support(model)
    with pytest.warns(UserWarning, match="trains without shared-prefix trees"):
        assert tree_cost(model) is None
    sliding = _model()
    sliding.config.layer_types = ["sliding_attention", "full_attention"]
    assert "sliding" in tree_support(sliding)


class _IgnoresMask(torch.nn.Module):
    """A model whose forward drops the attention mask: the tree path must be refused, not trained on."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = _model()
        self.config = self.inner.config

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def set_output_embeddings(self, head):
        self.inner.set_output_embeddings(head)

    def forward(self, input_ids, attention_mask=None, **kw):
        if attention_mask is not None and attention_mask.dim() == 4:
            attention_mask = None
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, **kw)


def test_a_model_that_ignores_the_tree_mask_is_refused():
    rows = rtpo_siblings(random.Random(4))
    [(order, trees)] = tree_chunks([r.input_ids for r in rows], FREE, 10_000)
    batch = collate([rows[i] for i in order])
    with warnings.catch_warnings(), pytest.raises(ConfigError, match=r"algo\.tree_training=off"):
        token_logprobs(_IgnoresMask(), batch, ForwardOptions(tree=True), trees)


def test_update_settings_validate_tree_training():
    with pytest.raises(ValueError, match="tree_training='on'"):
        UpdateSettings("token-mean", tree_training="on")
    assert dataclasses.replace(UpdateSettings("token-mean"), tree_training="auto").forward.tree
