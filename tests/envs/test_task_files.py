"""env.tasks: task files (jsonl / json / csv / parquet) read with `datasets`, bad rows named by line and
field, and the built-in QA-style environments running file tasks."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from horizonrl.cli import main
from horizonrl.config import ConfigError, load_config
from horizonrl.envs import format_answer, format_tool_call
from horizonrl.envs.core.common import split_of
from horizonrl.envs.core.taskfile import TaskFileError, TaskFileSpec, load_task_file
from horizonrl.train.rollout.env_setup import env_setup

pytest.importorskip("datasets")

ROWS = [
    {"qid": "a", "question": "What is 2+2?", "gold": 4, "split": "train", "level": 1},
    {"qid": "b", "question": "Capital of France?", "gold": ["Paris", "City of Light"], "split": "test"},
    {"qid": "c", "question": "Say 007.", "gold": "007", "split": "validation", "level": 3},
]


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _load(path: Path, **cols) -> dict:
    spec = TaskFileSpec.from_mapping({"path": str(path), **cols})
    return load_task_file(spec, "qa")


COLS = {"prompt": "question", "answer": "gold", "id": "qid", "split": "split"}


def test_jsonl_columns_map_to_tasks(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + "".join(json.dumps(r) + "\n" for r in ROWS[1:]))
    out = _load(path, **COLS)
    assert [t.id for t in out["train"]] == ["a"] and [t.id for t in out["test"]] == ["b", "c"]
    a, b, c = out["train"][0], *out["test"]
    assert (a.prompt, a.answer, a.aliases) == ("What is 2+2?", "4", ())
    assert (b.answer, b.aliases) == ("Paris", ("City of Light",))
    assert c.answer == "007"
    assert a.meta["fields"] == {"level": 1} and a.meta["row"] == f"{path}:1" and c.meta["row"] == f"{path}:4"
    assert a.meta["source"] == "file" and a.meta["env"] == "qa" and a.meta["split"] == "train"


def test_csv_parquet_and_json_give_the_same_tasks(tmp_path):
    pd = pytest.importorskip("pandas")
    rows = [
        {"question": f"q{i}?", "gold": f"{i:03d}", "split": "train" if i % 3 else "test"} for i in range(9)
    ]
    frame = pd.DataFrame(rows)
    frame.to_csv(tmp_path / "t.csv", index=False)
    frame.to_parquet(tmp_path / "t.parquet")
    (tmp_path / "t.json").write_text(json.dumps(rows))
    loaded = [
        _load(tmp_path / f"t.{ext}", prompt="question", answer="gold", split="split")
        for ext in ("csv", "parquet", "json")
    ]
    as_tuples = [{k: [(t.id, t.prompt, t.answer) for t in v] for k, v in out.items()} for out in loaded]
    assert as_tuples[0] == as_tuples[1] == as_tuples[2]
    assert [t.answer for t in loaded[0]["train"]] == [
        "001",
        "002",
        "004",
        "005",
        "007",
        "008",
    ]  # text, not int
    assert loaded[0]["train"][0].meta["row"] == f"{tmp_path / 't.csv'}:3"
    assert loaded[1]["train"][0].meta["row"] == f"{tmp_path / 't.parquet'} row 2"


def test_csv_multiline_cells_keep_their_line_numbers(tmp_path):
    (tmp_path / "m.csv").write_text('prompt,answer\n"two\nlines",1\nnext,\n')
    with pytest.raises(TaskFileError, match=r"m.csv:4: field 'answer' \(answer\) is empty"):
        _load(tmp_path / "m.csv")


def test_hash_split_without_a_split_column_follows_the_generated_task_rule(tmp_path):
    rows = [{"prompt": f"question {i}", "answer": str(i)} for i in range(200)]
    out = _load(_jsonl(tmp_path / "t.jsonl", rows))
    assert len(out["train"]) + len(out["test"]) == 200 and 20 <= len(out["test"]) <= 60
    for split, tasks in out.items():
        for t in tasks:
            assert split_of(json.dumps([t.prompt, [t.answer], {}], sort_keys=True)) == split
    again = _load(tmp_path / "t.jsonl")
    assert [t.id for t in again["test"]] == [t.id for t in out["test"]]


def test_train_and_test_files(tmp_path):
    spec = {
        "path": {
            "train": str(_jsonl(tmp_path / "tr.jsonl", ROWS[:2])),
            "test": str(_jsonl(tmp_path / "te.jsonl", ROWS[2:])),
        }
    }
    out = load_task_file(TaskFileSpec.from_mapping({**spec, "prompt": "question", "answer": "gold"}), "qa")
    assert [t.prompt for t in out["train"]] == ["What is 2+2?", "Capital of France?"]
    assert [t.prompt for t in out["test"]] == ["Say 007."]


def test_identical_rows_are_dropped_and_repeated_ids_refused(tmp_path):
    out = _load(_jsonl(tmp_path / "d.jsonl", [ROWS[0], ROWS[0], ROWS[1]]), **COLS)
    assert len(out["train"]) + len(out["test"]) == 2
    clash = [ROWS[0], {**ROWS[1], "qid": "a"}]
    with pytest.raises(TaskFileError, match=r"i.jsonl:2: id 'a' repeats the id of .*i.jsonl:1"):
        _load(_jsonl(tmp_path / "i.jsonl", clash), **COLS)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"question": "x", "gold": 1}\n{"question": "y", "gold": 2\n', r"b.jsonl:2: not valid JSON"),
        ('{"question": "x", "gold": 1}\n[1, 2]\n', r"b.jsonl:2: expected a JSON object per line, got list"),
        (
            '{"question": "x", "gold": 1}\n\n{"question": " ", "gold": 2}\n',
            r"b.jsonl:3: field 'question' \(prompt\) is empty",
        ),
        (
            '{"question": "x", "gold": 1}\n{"question": "y"}\n',
            r"b.jsonl:2: field 'gold' \(answer\) is missing",
        ),
        (
            '{"question": "x", "gold": {"v": 1}}\n',
            r"b.jsonl:1: field 'gold' \(answer\) must be text or a number",
        ),
        ('{"question": "x", "gold": []}\n', r"b.jsonl:1: field 'gold' \(answer\) is an empty list"),
        ('{"question": "x", "gold": true}\n', r"b.jsonl:1: field 'gold' \(answer\) is True, not text"),
        ('{"q": "x", "gold": 1}\n', r"b.jsonl: no column 'question' \(env.tasks.prompt\); columns: gold, q"),
        (b'{"question": "x", "gold": 1}\n{"question": "\xff", "gold": 2}\n', r"b.jsonl:2: not valid UTF-8"),
        ("", r"b.jsonl: has no rows|cannot be read"),
    ],
)
def test_bad_rows_are_named_by_line_and_field(tmp_path, content, message):
    path = tmp_path / "b.jsonl"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(TaskFileError, match=message) as e:
        _load(path, prompt="question", answer="gold")
    assert "\n" not in str(e.value)


def test_a_bad_split_value_is_named(tmp_path):
    path = _jsonl(tmp_path / "s.jsonl", [{**ROWS[0], "split": "dev"}])
    with pytest.raises(
        TaskFileError,
        match=r"s.jsonl:1: field 'split' \(split\) must be train, test or validation, got 'dev'",
    ):
        _load(path, **COLS)


def test_cli_reports_a_bad_task_file_in_one_line(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "x", "answer": 1}\n{"prompt": "y"}\n')
    code = main(["train", "env.name=qa", f"env.tasks={{path: {path}}}", f"train.out_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2 and err == f"horizonrl: error: {path}:2: field 'answer' (answer) is missing\n"


def test_config_validation_names_the_field():
    for override, message in [
        ("env.tasks={path: t.txt}", "env.tasks.path='t.txt': the file must end in"),
        ("env.tasks={path: t.jsonl, colour: red}", "env.tasks: unknown key(s) ['colour']"),
        ("env.tasks={path: t.jsonl, prompt: 3}", "env.tasks.prompt=3: expected a column name"),
    ]:
        with pytest.raises(ConfigError) as e:
            load_config(None, [override])
        assert str(e.value).startswith(message)


def test_non_qa_environments_refuse_task_files(tmp_path):
    path = _jsonl(tmp_path / "t.jsonl", [{"prompt": "x", "answer": "1"}])
    cfg = load_config(None, ["env.name=rooms", f"env.tasks={{path: {path}}}"])
    with pytest.raises(ConfigError, match=r"env.tasks: environment 'rooms' is not QA-style"):
        env_setup(cfg.env)


def test_pool_sizes_cap_the_file_and_subsample_deterministically(tmp_path):
    rows = [{"prompt": f"q {i}", "answer": str(i), "split": "train"} for i in range(50)] + [
        {"prompt": "t", "answer": "t", "split": "test"}
    ]
    path = _jsonl(tmp_path / "t.jsonl", rows)
    cfg = load_config(None, ["env.name=qa", f"env.tasks={{path: {path}, split: split}}"])
    setup = env_setup(cfg.env)
    a, b = setup.tasks(10, seed=3, split="train"), setup.tasks(10, seed=3, split="train")
    assert [t.id for t in a] == [t.id for t in b] and len(a) == 10
    order = [int(t.answer) for t in a]
    assert order == sorted(order)  # file order is kept
    assert len(setup.tasks(100, seed=3, split="train")) == 50
    only_train = _jsonl(tmp_path / "o.jsonl", rows[:5])
    setup = env_setup(
        load_config(None, ["env.name=qa", f"env.tasks={{path: {only_train}, split: split}}"]).env
    )
    with pytest.raises(ConfigError, match=r"env.tasks: the file has no test rows"):
        setup.tasks(5, seed=0, split="test")


# -- built-in QA environments on file tasks ---------------------------------------------------------------


def _setup(tmp_path, env, rows, **extra):
    path = _jsonl(tmp_path / f"{env}.jsonl", rows)
    over = [f"env.name={env}", f"env.tasks={{path: {path}, split: split}}"]
    over += [f"env.{k}={v}" for k, v in extra.items()]
    return env_setup(load_config(None, over).env)


def _run_expert(setup, task, max_steps=8):
    env = setup.make()
    env.reset(task)
    rng = random.Random(0)
    for _ in range(max_steps):
        res = env.step(env.expert_action(rng))
        if res.done:
            return res
    raise AssertionError("expert did not finish")


def test_qa_env_grades_the_reply_itself(tmp_path):
    setup = _setup(tmp_path, "qa", [{"prompt": "Capital of France?", "answer": "Paris", "split": "train"}])
    (task,) = setup.tasks(5, seed=0, split="train")
    env = setup.make()
    assert env.reset(task) == "Capital of France?" and env.tools == []
    res = env.step("  paris. ")
    assert res.done and res.success and res.reward == 1.0 and res.final_answer == "paris."
    env.reset(task)
    assert not env.step("<answer>Lyon</answer> because").success


def test_lookup_on_file_tasks_searches_the_given_facts(tmp_path):
    rows = [
        {
            "prompt": "Where does Ana work?",
            "answer": "Acme",
            "facts": ["Ana works at Acme.", "Bo works at Zed.", "Acme is in Paris."],
            "split": "train",
        }
    ]
    setup = _setup(tmp_path, "lookup", rows)
    (task,) = setup.tasks(5, seed=0, split="train")
    env = setup.make()
    env.reset(task)
    assert (
        env.step(format_tool_call("search", {"query": "acme"})).observation
        == "Ana works at Acme. Acme is in Paris."
    )
    assert env.step(format_tool_call("search", {"query": "Ann"})).observation == 'No facts about "Ann".'
    assert env.step(format_answer("acme")).success
    assert _run_expert(setup, task).success


def test_lookup_needs_its_facts_column(tmp_path):
    path = _jsonl(tmp_path / "l.jsonl", [{"prompt": "x", "answer": "y"}])
    with pytest.raises(ConfigError, match="environment 'lookup' needs a column 'facts'"):
        env_setup(load_config(None, ["env.name=lookup", f"env.tasks={{path: {path}}}"]).env)


def test_search_on_file_tasks_uses_its_corpus(tmp_path):
    pytest.importorskip("bm25s")
    from horizonrl.envs.builtin.search import load_corpus

    doc = load_corpus("builtin").documents[0]
    rows = [
        {
            "prompt": f"What is {doc.title} about?",
            "answer": doc.title,
            "gold_docs": [doc.id],
            "split": "train",
        }
    ]
    setup = _setup(tmp_path, "search", rows, reward="token_f1")
    (task,) = setup.tasks(5, seed=0, split="train")
    env = setup.make()
    env.reset(task)
    hits = env.step(format_tool_call("search", {"query": doc.title})).observation
    assert f"[{doc.id}]" in hits
    res = _run_expert(setup, task)
    assert res.success and res.reward == 1.0
    env.reset(task)
    partial = env.step(format_tool_call("finish", {"answer": doc.title.split()[0]}))
    words = len(doc.title.split())
    assert partial.done and (words == 1 or 0 < partial.reward < 1)


def test_math_python_on_file_tasks_is_graded_by_math_equivalence(tmp_path):
    pytest.importorskip("reasoning_gym")
    rows = [{"prompt": "What is half of 3?", "answer": "3/2", "split": "train"}]
    setup = _setup(tmp_path, "math_python", rows)
    (task,) = setup.tasks(5, seed=0, split="train")
    env = setup.make()
    env.reset(task)
    res = env.step(format_answer("\\boxed{1.5}"))
    assert res.done and res.success and res.reward == 1.0
    env.reset(task)
    assert env.step(format_answer("1.4")).reward == 0.0
    assert _run_expert(setup, task).success
