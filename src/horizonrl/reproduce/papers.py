"""The papers' comparisons as :class:`~horizonrl.reproduce.spec.Paper` declarations.

Each declaration is the regime (task, model, warm start), the arms and the claims
to test; ``horizonrl reproduce NAME`` runs it. The numbers these produce are in
``docs/results/NAME.md``.
"""

from __future__ import annotations

from horizonrl.reproduce.spec import Arm, Comparison, Paper, register_paper

# ---------------------------------------------------------------- RTPO

RTPO_REGIME = (
    # h64 x 2: ~3x faster than the default tiny model; its copy pretraining converges (pretrain.json).
    "model.tiny_hidden=64",
    "model.tiny_layers=2",
    # Four hops = five turns (K = 5 boundaries), an unreliable search tool (a distractor result with
    # probability 0.2, which the expert retries), one turn of slack.
    "env.knobs={hops: 4, n_entities: 4, tool_noise: 0.2}",
    "env.train_tasks=4000",
    "rollout.max_turns=6",
    "rollout.max_new_tokens=40",
    "rollout.temperature=0.9",  # paper E.3
    "rollout.context=turn_summary",
    "rollout.context_params={summarizer: extract, obs_chars: 120}",
    "algo.kl_coef=0.02",  # paper E.3: low_var_kl, initial 0.02 (no adaptive controller)
    "algo.kl_kind=low_var_kl",
    "algo.logprob_clip=10.0",  # paper E.3: [-10, 10]
    "optim.weight_decay=0.01",  # paper E.3
    "optim.lr=1.0e-4",  # paper 1e-6 for 1.5-8B models; scaled to the 0.2M-parameter tiny model
    "sft.demos=2000",
    "sft.noise=0.3",
    "sft.epochs=2",
)

_GROUP = ("train.trainer=group", "rollout.group_size=8", "rollout.tasks_per_step=4")


@register_paper("rtpo")
def rtpo() -> Paper:
    return Paper(
        name="rtpo",
        title="RTPO: reverse-turn policy optimization vs flattened GRPO and SeeUPO",
        claim=(
            "Training each turn under the exact context it was sampled from keeps the rollout/train ratio at "
            "1 where flattened-history training drifts (Sec. 4.2, Fig. 3), and RTPO's on-policy siblings at "
            "every turn boundary beat flattened GRPO and SeeUPO at a matched budget, on-policy siblings "
            "beating reused off-policy continuations (Sec. 4.3-4.4, Table 1)."
        ),
        base="rtpo_lookup",
        overrides=RTPO_REGIME,
        arms=(
            Arm(
                "rtpo",
                (
                    "train.trainer=rtpo",
                    "rtpo.trunks_per_task=2",
                    "rtpo.siblings=4",
                    "rollout.tasks_per_step=4",
                ),
                help="trunks + 3 on-policy siblings per boundary",
            ),
            Arm(
                "rtpo_offpolicy",
                (
                    "train.trainer=rtpo",
                    "rtpo.trunks_per_task=2",
                    "rtpo.siblings=4",
                    "rollout.tasks_per_step=4",
                    "rtpo.off_policy=true",
                ),
                help="siblings sampled once by theta_0, clamped trajectory IS weight",
            ),
            Arm(
                "grpo_flat",
                (*_GROUP, "algo.train_context=flat"),
                help="the paper's GRPO: trained on the flattened full history, pi_old as recorded",
            ),
            Arm(
                "grpo_flat_recompute",
                (*_GROUP, "algo.train_context=flat", "algo.old_logprobs=recompute"),
                help="flattened GRPO with pi_old recomputed under the training context (verl-style)",
            ),
            Arm(
                "grpo",
                _GROUP,
                help="GRPO at the exact sampled contexts (the paper's credit-assignment control)",
            ),
            Arm(
                "seeupo",
                ("train.trainer=seeupo", "rollout.group_size=8", "rollout.tasks_per_step=4"),
                help="independent chains, reverse per-turn updates over flat histories",
            ),
        ),
        comparisons=(
            Comparison("rtpo", "grpo_flat", "RTPO > flattened GRPO"),
            Comparison("rtpo", "grpo_flat_recompute", "RTPO > flattened GRPO (recomputed pi_old)"),
            Comparison("rtpo", "seeupo", "RTPO > SeeUPO"),
            Comparison("rtpo", "grpo", "RTPO > exact-context GRPO (credit assignment alone)"),
            Comparison("rtpo", "rtpo_offpolicy", "on-policy siblings > off-policy continuations"),
        ),
        budget_tokens=120_000,
        eval_temperature=0.6,
        diagnostics=("train/kl_rollout_train", "rtpo/is_weight_mean", "rollout/turns_mean"),
        notes=(
            "Task: 4-hop `lookup` with an unreliable search tool (a distractor result with probability 0.2) "
            "under the extractive turn-summary map psi, so the context a turn saw differs from its full "
            "history and later randomness contaminates trajectory-level credit. Model: the embedded tiny "
            "model at hidden 64 x 2 layers. Each RTPO iteration samples 2 trunks per task for 4 tasks and 3 "
            "siblings at every realized boundary; group-trainer arms sample 4 tasks x G = 8."
        ),
    )
