"""Every user error is one clear line and exit status 2, never a traceback.

Config values, names and devices; config files of every wrong kind; command-line JSON; data files
(rollouts, SFT demonstrations, corpora, the judge cache) read by the one JSONL reader; non-finite
training. Each case runs the real CLI in process (errors are raised before any model loads).
"""

from __future__ import annotations

import json
import re
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from horizonrl.cli import main
from horizonrl.config import from_dict, load_config
from horizonrl.credit import register_estimator
from horizonrl.errors import ConfigError, DataError, HorizonWarning, NonFiniteError
from horizonrl.jsonl import MAX_INT_DIGITS, append_jsonl, read_jsonl
from horizonrl.safe_yaml import load_yaml
from horizonrl.train.records import checkpoint as ckpt
from horizonrl.train.records.metrics import read_metrics
from horizonrl.train.trainers.group import GroupTrainer
from horizonrl.trajectory import Rollout, Segment, Turn, UnknownFieldWarning, write_jsonl
from horizonrl.trajectory import read_jsonl as read_rollouts


def _one_error_line(capsys, code: int) -> str:
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith("horizonrl: error: "), err
    return lines[0]


@pytest.mark.parametrize(
    ("override", "expect"),
    [
        (
            "train.trainer=nope",
            "train.trainer='nope': unknown trainer; known: ['gateway', 'group', 'rtpo', 'seeupo']",
        ),
        ("rollout.agent=nope", "rollout.agent='nope': unknown agent"),
        ("rollout.context=nope", "rollout.context='nope': unknown context manager"),
        ("algo.estimator=nope", "algo.estimator='nope': unknown estimator"),
        ("inference.engine=nope", "inference.engine='nope': unknown engine"),
        ("env.name=nope", "env.name='nope': unknown environment"),
        ("env.knobs={nope: 1}", "env.knobs: arithmetic: unknown knob 'nope'"),
        ("env.knobs={n_ops: true}", "knob 'n_ops' must be an integer"),
        (
            "algo.estimator_params={nope: 1}",
            "algo.estimator_params: unknown parameter(s) ['nope'] of estimator",
        ),
        ("algo.estimator_params={eps: true}", "algo.estimator_params.eps=True: must be float"),
        ("algo.estimator_params={normalize_std: 1}", "algo.estimator_params.normalize_std=1: must be bool"),
        (
            "rollout.agent_params={nope: 1}",
            "rollout.agent_params: unknown parameter(s) ['nope'] of agent 'react'",
        ),
        ("rollout.context_params={nope: 1}", "rollout.context_params: unknown parameter(s) ['nope']"),
        ("inference.params={nope: 1}", "inference.params: unknown parameter(s) ['nope'] of engine 'hf'"),
        ("inference.params={compact_fraction: x}", "inference.params.compact_fraction='x': must be float"),
        ("rollout.group_size=true", "rollout.group_size=True: expected int"),
        ("rollout.group_size=1000000000000", "rollout.group_size=1000000000000: must be <= 4096"),
        ("model.tiny_hidden=1000000000", "model.tiny_hidden=1000000000: must be <= 8192"),
        ("train.seed=100000000000000000000000", "train.seed=100000000000000000000000: must be <= 4294967295"),
        ("train.seed=-1", "train.seed=-1: must be >= 0"),
        ("optim.lr=.inf", "optim.lr=inf: must be a finite number"),
        ("optim.lr=.nan", "optim.lr=nan: must be a finite number"),
        ("optim.lr=inf", "optim.lr=inf: must be a finite number"),
        ("optim.weight_decay=.nan", "optim.weight_decay=nan: must be a finite number"),
        ("optim.beta2=.nan", "optim.beta2=nan: must be a finite number"),
        ("train.trainer_params.weight_high=.inf", "trainer 'group' takes no parameters"),
        ("train.eval_fractions=[.nan]", "train.eval_fractions=[nan]: nan is not a number in (0, 1]"),
        ("train.eval_fractions=[a]", "'a' is not a number in (0, 1]"),
        ("model.device=banana", "model.device='banana': must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"),
        ("env.train_tasks=1000", "widen the knobs"),
    ],
)
def test_bad_names_and_values_are_one_line(capsys, tmp_path, override, expect):
    args = ["train", f"train.out_dir={tmp_path / 'run'}", "env.knobs={n_ops: 1, max_operand: 2, ops: '+'}"]
    code = main([*args, override])
    line = _one_error_line(capsys, code)
    assert expect in line, line
    assert not (tmp_path / "run" / "base_model").exists()  # refused before any work


@pytest.mark.parametrize(
    ("override", "expect"),
    [
        (
            "train.trainer_params.weight_high=.inf",
            "train.trainer_params.weight_high=inf: must be a finite number",
        ),
        ("train.trainer_params.siblings=1", "train.trainer_params.siblings=1: must be >= 2"),
        (
            "train.trainer_params.nope=1",
            "train.trainer_params: unknown parameter(s) ['nope'] of trainer 'rtpo'; known:",
        ),
    ],
)
def test_trainer_params_are_checked_against_the_trainer(capsys, tmp_path, override, expect):
    args = ["train", f"train.out_dir={tmp_path / 'run'}", "train.trainer=rtpo", override]
    line = _one_error_line(capsys, main(args))
    assert expect in line, line
    assert not (tmp_path / "run" / "base_model").exists()


def test_the_former_rtpo_section_is_read_as_trainer_params():
    with pytest.warns(HorizonWarning, match="'rtpo' is now train.trainer_params"):
        cfg = load_config(None, ["train.trainer=rtpo", "rtpo.siblings=4", "train.trainer_params.flat=true"])
    assert cfg.train.trainer_params == {"siblings": 4, "flat": True}
    # A saved config.yaml of an earlier run lists the whole former section at its defaults: a group run
    # loads (and resumes) with no parameters and no warning.
    old = {"rtpo": {"trunks_per_task": 1, "siblings": 3, "flat": False, "max_rollouts": 0}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert from_dict(old).train.trainer_params == {}


def test_the_former_rtpo_defaults_are_the_reverse_turn_trainers():
    """config cannot import the trainers, so it keeps its own copy of the old section's defaults (dropped when
    an old config is read); the copy must be the defaults the reverse-turn trainers declare."""
    import dataclasses

    from horizonrl.config.run import MOVED_SECTIONS
    from horizonrl.train.methods.reverse_turn import ReverseTurnParams

    declared = {f.name: f.default for f in dataclasses.fields(ReverseTurnParams)}
    assert MOVED_SECTIONS["rtpo"] == ("train.trainer_params", declared)


def test_a_context_param_value_is_checked_at_start(capsys, tmp_path):
    code = main(
        [
            "train",
            f"train.out_dir={tmp_path}",
            "rollout.context=compaction",
            "rollout.context_params={prompts: bogus}",
        ]
    )
    assert "rollout.context_params={'prompts': 'bogus'}: compaction: prompts='bogus'" in _one_error_line(
        capsys, code
    )


@pytest.mark.skipif(torch.cuda.device_count() >= 8, reason="this machine has a cuda:7")
def test_a_device_that_does_not_exist(capsys, tmp_path):
    line = _one_error_line(capsys, main(["train", f"train.out_dir={tmp_path}", "model.device=cuda:7"]))
    assert "model.device='cuda:7': " in line and ("not available" in line or "CUDA device(s)" in line)


def test_an_output_dir_that_is_a_file(capsys, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    line = _one_error_line(capsys, main(["train", f"train.out_dir={f}"]))
    assert f"train.out_dir='{f}': exists and is not a directory" in line
    line = _one_error_line(capsys, main(["train", f"train.out_dir={f / 'run'}"]))
    assert "a parent of it is a file" in line
    line = _one_error_line(capsys, main(["quickstart", "--out", str(f)]))
    assert "sft.out_dir=" in line and "a parent of it is a file" in line


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        (None, "is not a regular file (a directory?)"),
        ("[1, 2]\n", "must be a mapping of sections (model:, env:, ...), got list"),
        ("42\n", "must be a mapping of sections (model:, env:, ...), got int"),
        ("just text\n", "must be a mapping of sections (model:, env:, ...), got str"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "is a binary file, not YAML"),
        (b"train:\n  out_dir: \xff\xfe\n", "is not UTF-8 text (invalid byte at offset 18)"),
        ("a: !!python/object/apply:os.system ['echo hi']\n", "YAML tag !!python/object/apply:os.system is"),
        ("env:\n  knobs: !!set {a, b}\n", "YAML tag !!set is not allowed (line 2)"),
        ("env:\n  knobs: !!binary aGk=\n", "YAML tag !!binary is not allowed"),
        ("x: !custom 1\n", "YAML tag !custom is not allowed"),
        (BOMB, "YAML expands to over 100000 values"),
        ("a: &a [*a]\n", "YAML alias refers to itself"),
        ("a: " + "[" * 100 + "]" * 100 + "\n", "YAML is nested deeper than 64"),
        ("a: " + "[" * 5000 + "\n", "is not valid YAML"),
        ("rollout:\n  group_size: [4\n", "is not valid YAML: expected ',' or ']'"),
        ("rollout: [1, 2]\n", "section 'rollout' must be a mapping, got [1, 2]"),
    ],
)  # fmt: skip
def test_config_files_of_every_wrong_kind(capsys, tmp_path, content, expect):
    path = tmp_path / "c.yaml"
    if content is None:
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    t0 = time.perf_counter()
    line = _one_error_line(capsys, main(["train", "--config", str(path), f"train.out_dir={tmp_path}"]))
    assert time.perf_counter() - t0 < 5
    assert str(path) in line and expect in line, line


def test_safe_yaml_keeps_what_configs_use():
    assert load_yaml("a: 2024-01-01\nb: 1e-3\nc: .5\nd: null\ne: [1, {f: yes}]\n") == {
        "a": "2024-01-01",
        "b": "1e-3",
        "c": 0.5,
        "d": None,
        "e": [1, {"f": True}],
    }
    assert load_yaml("base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  y: 3\n")["other"] == {"x": 1, "y": 3}


def test_a_utf8_bom_config_loads(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"\xef\xbb\xbfrollout:\n  group_size: 3\n")
    assert load_config(path).rollout.group_size == 3


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["--knobs", "{bad"], "--knobs '{bad': not valid JSON (Expecting property name enclosed in"),
        (["--knobs", "[1, 2]"], "--knobs '[1, 2]': must be a JSON object"),
        (["--knobs", "{\"n_ops\": NaN}"], "not valid JSON (NaN is not allowed here)"),
        (["--knobs", "{\"nope\": 1}"], "--knobs: arithmetic: unknown knob 'nope'"),
        (["--env", "nope"], "--env='nope': unknown environment"),
        (["--n", "0"], "--n=0: must be in [1, 10000000]"),
        (["--noise", "nan"], "--noise=nan: must be in [0, 1]"),
    ],
)  # fmt: skip
def test_bad_command_line_arguments_of_demos(capsys, tmp_path, argv, expect):
    base = {"--env": "arithmetic", "--n": "2", "--out": str(tmp_path / "d.jsonl")}
    base.update(dict(zip(argv[::2], argv[1::2], strict=True)))
    code = main(["demos", *[x for kv in base.items() for x in kv]])
    assert expect in _one_error_line(capsys, code)
    assert not (tmp_path / "d.jsonl").exists()


def test_packaged_configs_pass_the_start_checks():
    from horizonrl.train.recipes import packaged_config
    from horizonrl.train.trainers.checks import check_run

    configs = sorted(packaged_config("quickstart").parent.glob("*.yaml"))
    assert len(configs) >= 20
    for path in configs:
        check_run(load_config(path))


# ------------------------------------------------------------------ the JSONL reader


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("data", "expect"),
    [
        (b'{"a": 1}\n{oops}\n{"a": 2}\n', r"f\.jsonl:2: not valid JSON \(Expecting property name"),
        (b'{"a": 1}\n[1, 2]\n', r"f\.jsonl:2: expected a JSON object, got list"),
        (b'{"a": 1}\n{"a": "\xff"}\n{"a": 3}\n', r"f\.jsonl:2: invalid UTF-8 at byte 7 of the line"),
        (b"\xff\xfe{\x00}\x00\n\x00", r"f\.jsonl: the file is UTF-16 encoded; records must be UTF-8"),
        (b'{"a": ' + b"[" * 100_000 + b"\n", r"f\.jsonl:1: not valid JSON \(nested too deeply\)"),
        (b'{"a": ' + b"9" * 5000 + b"}\n", rf"f\.jsonl:1: .*integer with 5000 digits \(at most {MAX_INT_DIGITS}"),  # noqa: E501
        (b'{"a": NaN}\n', r"f\.jsonl:1: not valid JSON \(NaN is not allowed here\)"),
        (b'{"a": 1e999}\n', r"f\.jsonl:1: not valid JSON \(number 1e999 is out of the float range\)"),
    ],
)  # fmt: skip
def test_bad_lines_name_the_file_and_line(tmp_path, data, expect):
    with pytest.raises(DataError, match=expect):
        list(read_jsonl(_write(tmp_path / "f.jsonl", data)))


def test_a_torn_last_line_is_skipped_with_a_warning(tmp_path):
    path = _write(tmp_path / "f.jsonl", b'\xef\xbb\xbf{"a": 1}\n\n{"a": 2}\n{"a": 3, "b": [1, 2')
    with pytest.warns(HorizonWarning, match=r"f\.jsonl:4: the last line is incomplete"):
        assert [(r.line, r.value) for r in read_jsonl(path)] == [(1, {"a": 1}), (3, {"a": 2})]
    with pytest.raises(DataError, match=r"f\.jsonl:4: not valid JSON"):
        list(read_jsonl(path, torn_tail="error"))
    # A torn multi-byte character at the very end is torn too.
    path = _write(tmp_path / "g.jsonl", '{"a": 1}\n{"a": "é'.encode()[:-1])
    with pytest.warns(HorizonWarning, match="incomplete"):
        assert [r.value for r in read_jsonl(path)] == [{"a": 1}]
    # Appending after it cuts the torn line off, so the file stays readable.
    with pytest.warns(HorizonWarning, match="removed an incomplete last line"):
        append_jsonl(path, {"a": 2})
    assert [r.value for r in read_jsonl(path)] == [{"a": 1}, {"a": 2}]


def _rollouts(n: int) -> list[Rollout]:
    turn = Turn(prompt_ids=[1, 2], response_ids=[3, 4], logprobs=[-0.5, float("nan")], response_text="hi")
    return [
        Rollout(uid=f"r{i}", task_id="t", group_id="g", segments=[Segment(turns=[turn])]) for i in range(n)
    ]


T0 = "segments[0].turns[0]."


def _turn0(d):
    return d["segments"][0]["turns"][0]


def test_view_uses_the_rollouts_before_a_torn_last_line(capsys, tmp_path):
    path = tmp_path / "step_1.jsonl"
    write_jsonl(path, _rollouts(3))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 40])  # the last rollout was being written when the run died
    assert main(["view", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.count("=== rollout") == 2 and "Traceback" not in err
    assert err.startswith("horizonrl: warning: ") and "step_1.jsonl:3: the last line is incomplete" in err


@pytest.mark.parametrize(
    ("edit", "expect"),
    [
        (lambda d: _turn0(d).update(response_ids=5), T0 + "response_ids: must be a list, got int"),
        (lambda d: _turn0(d).update(prompt_ids=[1, True]), T0 + "prompt_ids[1]: must be an integer token id"),
        (lambda d: _turn0(d).pop("logprobs"), "segments[0].turns[0].logprobs: is missing"),
        (lambda d: _turn0(d).update(logprobs=[0.0]), "Turn has 2 response ids but 1 logprobs"),
        (lambda d: d.update(reward="high"), "reward: must be int or float, got 'high'"),
        (lambda d: d.update(success=1), "success: must be bool, got 1"),
        (lambda d: d["segments"][0].update(kind="weird"), "Segment.kind='weird' is not one of"),
        (lambda d: d.update(segments={"a": 1}), "segments: must be list, got {'a': 1}"),
    ],
)  # fmt: skip
def test_a_wrong_typed_rollout_names_the_line_and_field(capsys, tmp_path, edit, expect):
    path = tmp_path / "r.jsonl"
    write_jsonl(path, _rollouts(2))
    lines = path.read_text().splitlines()
    d = json.loads(lines[1])
    edit(d)
    path.write_text(lines[0] + "\n" + json.dumps(d) + "\n")
    # Loading for training refuses the file, naming file, line and field ...
    with pytest.raises(DataError, match="r.jsonl:2: not a rollout record: " + re.escape(expect)):
        list(read_rollouts(path))
    # ... and the viewer shows the good record and reports the bad one by the same name.
    assert main(["view", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.count("=== rollout") == 1 and f"r.jsonl:2: not a rollout record: {expect}" in err


def test_an_unknown_rollout_field_is_ignored_with_a_warning(capsys, tmp_path):
    path = tmp_path / "r.jsonl"
    write_jsonl(path, _rollouts(1))
    d = json.loads(path.read_text())
    d["colour"] = "red"
    path.write_text(json.dumps(d) + "\n")
    with pytest.warns(UnknownFieldWarning, match=r"r.jsonl:1.*colour"):
        (r,) = list(read_rollouts(path))
    assert r.uid == d["uid"]
    assert main(["view", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.count("=== rollout") == 1 and "colour" in err and "horizonrl: warning:" in err


def _msg(role, content):
    return {"role": role, "content": content}


def _demo(**over):
    d = {
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": "A"},
        ],
        "tools": [],
    }
    d.update(over)
    return json.dumps(d)


@pytest.mark.parametrize(
    ("lines", "expect"),
    [
        ([], "d.jsonl: no demonstrations (the file has no records)"),
        (["", "  "], "d.jsonl: no demonstrations"),
        ([_demo(), _demo(messages=[_msg("bot", "x")])], "d.jsonl:2: field 'messages[0].role': unknown role"),
        ([_demo(messages=[_msg("user", "U")])], "d.jsonl:1: field 'messages': has no assistant message"),
        ([_demo(messages=[_msg("assistant", 3)])], "field 'messages[0].content': must be a string, got int"),
        ([_demo(messages="hi")], "d.jsonl:1: field 'messages' must be list, got 'hi'"),
        ([_demo(tools=[1])], "d.jsonl:1: field 'tools': must be a list of tool schemas"),
        (['{"messages": [' * 3000], "not valid JSON (nested too deeply)"),
    ],
)  # fmt: skip
def test_bad_sft_data_is_an_error_and_writes_no_model(capsys, tmp_path, lines, expect):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(ln + "\n" for ln in lines))
    out = tmp_path / "sft"
    code = main(["sft", f"sft.data={data}", f"sft.out_dir={out}", "model.tiny_pretrain_steps=0"])
    assert expect in _one_error_line(capsys, code)
    assert not out.exists()


def test_a_missing_sft_file_is_one_line(capsys, tmp_path):
    code = main(["sft", f"sft.data={tmp_path / 'none.jsonl'}", f"sft.out_dir={tmp_path / 'sft'}"])
    assert "none.jsonl" in _one_error_line(capsys, code)


def test_corpus_and_judge_cache_use_the_reader(tmp_path):
    from horizonrl.envs.builtin.search.corpus import load_corpus
    from horizonrl.inference.openai_client import ChatClient
    from horizonrl.judge import LLMJudge

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "a", "title": "A", "text": "x"}\n{"id": "b", "title": "B", "te')
    with pytest.warns(HorizonWarning, match=r"corpus\.jsonl:2: the last line is incomplete"):
        assert [d.id for d in load_corpus(str(corpus)).documents] == ["a"]
    entry = {"key": "k1", "correct": True, "raw": "yes", "parsed": True}
    cache = tmp_path / "judge.jsonl"
    cache.write_text(json.dumps(entry) + "\n" + '{"key": "k2", "corr')
    client = ChatClient("http://127.0.0.1:9/v1", "judge")
    with pytest.warns(HorizonWarning, match=r"judge\.jsonl:2: the last line is incomplete"):
        judge = LLMJudge(client, cache_path=cache)
    assert list(judge._cache) == ["k1"]
    cache.write_text(json.dumps(entry) + "\n" + json.dumps({**entry, "key": "k2", "correct": "yes"}) + "\n")
    with pytest.raises(DataError, match=r"judge\.jsonl:2: field 'correct' must be bool, got 'yes'"):
        LLMJudge(client, cache_path=cache)


# ------------------------------------------------------------------ non-finite training


@register_estimator("nan_credit_test", replace=True, description="test only: NaN advantages on every token")
def _nan_credit(groups):
    return [
        [[np.full(t.num_response_tokens, np.nan) for t in seg.turns] for seg in r.segments]
        for g in groups
        for r in g.rollouts
    ]


def _train_args(model_dir, out_dir, *extra):
    return [
        f"model.path={model_dir}",
        "env.knobs={n_ops: 1, max_operand: 9}",
        "env.train_tasks=20",
        "env.test_tasks=2",
        "rollout.group_size=2",
        "rollout.tasks_per_step=2",
        "rollout.max_new_tokens=16",
        "rollout.max_turns=2",
        "rollout.context_budget=512",
        "train.eval_samples=1",
        "train.progress=false",
        "train.steps=2",
        "train.save_every=1",
        "algo.estimator=nan_credit_test",
        f"train.out_dir={out_dir}",
        *extra,
    ]


def test_a_non_finite_loss_stops_the_run_naming_the_step_and_writes_no_checkpoint(
    capsys, tiny_model_dir, tmp_path
):
    code = main(["train", *_train_args(tiny_model_dir, tmp_path / "run")])
    line = _one_error_line(capsys, code)
    assert "horizonrl: error: step 1: non-finite loss (loss nan" in line and "optim.nonfinite=skip" in line
    assert ckpt.list_checkpoints(tmp_path / "run" / "checkpoints") == []
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [0]  # only the evaluation before training


def test_nonfinite_skip_drops_the_batch_and_keeps_the_weights_finite(tiny_model_dir, tmp_path):
    cfg = load_config(None, _train_args(tiny_model_dir, tmp_path / "run", "optim.nonfinite=skip"))
    trainer = GroupTrainer(cfg)
    start = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    records = trainer.fit()
    assert [r["train/skipped_batches"] for r in records[1:]] == [1.0, 1.0]
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, start[k]), k  # every update was skipped
    ckpt.read_checkpoint(tmp_path / "run" / "checkpoints" / "step_2")


def test_a_model_with_nan_parameters_is_never_saved(tiny_model_dir, tmp_path):
    from horizonrl.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(tiny_model_dir)
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("inf")
    with pytest.raises(NonFiniteError, match="holds NaN or infinite values"):
        ckpt.save_checkpoint(tmp_path / "c", 1, model=model, tokenizer=tok, state={"step": 1})
    assert not (tmp_path / "c" / "step_1").exists() and not (tmp_path / "c" / ".step_1.tmp").exists()


def test_config_errors_are_typed():
    with pytest.raises(ConfigError):
        load_config(None, ["optim.lr=.inf"])
