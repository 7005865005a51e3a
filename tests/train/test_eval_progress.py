"""Evaluation progress (``train.progress``): a bar on stderr with tasks done / total and generated
tokens/s, and not one rollout or number different from an evaluation without it."""

from __future__ import annotations

import json
import re

import pytest

from helpers.shaped_env import arith_run_overrides
from horizonrl.agents.driver import DriverOptions, Generate, Spawn, drive
from horizonrl.cli import main
from horizonrl.config import load_config
from horizonrl.inference.base import Engine, Generation, SamplingParams
from horizonrl.train.rollout.progress import EvalProgress, watched
from horizonrl.train.trainers.group import GroupTrainer

LONG = SamplingParams(max_new_tokens=5)
SHORT = SamplingParams(max_new_tokens=2, temperature=0.5)


class _CountingEngine(Engine):
    """Answers every prompt with ids that depend on the call number, and records every batch."""

    def __init__(self):
        self.batches: list[tuple[SamplingParams, list[list[int]]]] = []
        self.tokens = 0

    def generate(self, prompts, params):
        self.batches.append((params, [list(p) for p in prompts]))
        n = len(self.batches)
        gens = [
            Generation(ids=[n, *p][: params.max_new_tokens], logprobs=[], text="", finish_reason="stop")
            for p in prompts
        ]
        self.tokens += sum(len(g.ids) for g in gens)
        return gens

    def score(self, contexts, continuations):
        raise NotImplementedError


def _child(tag: int, params: SamplingParams):
    g = yield Generate([tag, 7], params)
    return g.ids


def _root(i: int):
    """An episode with a variable number of turns and, for odd ``i``, two subagents."""
    out = []
    for turn in range(1 + i % 3):
        g = yield Generate([i, turn], LONG)
        out.append(g.ids)
    if i % 2:
        out.append((yield Spawn([_child(10 * i + 1, SHORT), _child(10 * i + 2, LONG)])))
    if i == 4:
        out.append((yield Spawn([])))
    return out


@pytest.mark.parametrize("threads", [1, 3])
def test_watched_programs_make_the_same_batches_and_results_and_count_every_token(capsys, threads):
    tasks, samples = 3, 2
    options = DriverOptions(threads=threads)
    plain = _CountingEngine()
    want = drive(plain, [_root(i) for i in range(tasks * samples)], options)
    seen = _CountingEngine()
    progress = EvalProgress(tasks, samples, interval=0.0)
    got = drive(seen, [watched(_root(i), progress, i // samples) for i in range(tasks * samples)], options)
    progress.close()
    assert got == want and seen.batches == plain.batches  # same requests, same order, same batches
    assert any(params == SHORT for params, _ in plain.batches)  # the subagents' batches ...
    assert progress.tokens == plain.tokens > 0  # ... and their tokens are counted too
    assert progress.episodes == tasks * samples and progress.bar.n == tasks
    err = capsys.readouterr().err
    assert "eval:" in err and "3/3" in err and "6/6 episodes" in err and "tok/s" in err


class _Quiet:
    """An :class:`EvalProgress` that shows nothing."""

    def generated(self, n):
        pass

    def episode_done(self, task):
        pass


def test_a_watched_program_fails_as_it_would_unwatched():
    def broken():
        yield Generate([1], LONG)
        raise KeyError("tool")

    for wrap in (lambda p: p, lambda p: watched(p, _Quiet(), 0)):
        with pytest.raises(KeyError, match="tool"):
            drive(_CountingEngine(), [_root(0), wrap(broken())])


def _metrics(records):
    """Every logged number but the wall-clock ones."""
    return [{k: v for k, v in r.items() if not re.search(r"time|_s$|per_s|/s\b", k)} for r in records]


def test_an_evaluation_shows_its_progress_and_changes_no_number(tiny_model_dir, tmp_path, capsys):
    runs = {}
    for on in (False, True):
        out = tmp_path / f"progress_{on}"
        cfg = load_config(
            None,
            arith_run_overrides(
                tiny_model_dir,
                out,
                "train.steps=1",
                "train.save_rollouts=false",
                f"train.progress={str(on).lower()}",
            ),
        )
        trainer = GroupTrainer(cfg)
        try:
            records = trainer.fit()
        finally:
            trainer.close()
        evals = [json.loads((out / "eval" / f"step_{s}.json").read_text()) for s in (0, 1)]
        runs[on] = (records, evals, capsys.readouterr().err)
    (off, off_evals, off_err), (on, on_evals, on_err) = runs[False], runs[True]
    # The evaluations (before the first step and after the last) and the step between them: exactly equal.
    assert [r["step"] for r in on] == [0, 1] and "eval/pass@1" in on[0] and "eval/pass@1" in on[1]
    assert _metrics(on) == _metrics(off) and on_evals == off_evals
    # With progress on, each evaluation drew a bar: 4 test tasks x 2 samples; nothing without it.
    bars = re.findall(r"eval: +\d+%\|[^|]*\| (\d+)/4 \[[^\]]*?, (\d+)/8 episodes, [\d.]+ tok/s\]", on_err)
    assert ("0", "0") in bars and ("4", "8") in bars, on_err
    assert "eval:" not in off_err and "tok/s" not in off_err


def test_horizonrl_eval_shows_progress_with_train_progress(tiny_model_dir, tmp_path, capsys):
    got = {}
    for on in (False, True):
        args = [*arith_run_overrides(tiny_model_dir, tmp_path), f"train.progress={str(on).lower()}"]
        assert main(["eval", "--model", str(tiny_model_dir), *args]) == 0
        cap = capsys.readouterr()
        got[on] = (json.loads(cap.out), cap.err)
    assert got[True][0] == got[False][0]
    assert re.search(r"eval: +100%\|[^|]*\| 4/4 \[.*8/8 episodes", got[True][1]), got[True][1]
    assert "eval:" not in got[False][1]
