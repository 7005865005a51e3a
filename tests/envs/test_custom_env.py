"""User environments: @tool schemas from type hints and docstrings, CustomEnv episodes, env.imports,
and the examples/custom_env walkthrough trained for two steps on the tiny model."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any, Literal

import pytest

from horizonrl.config import ConfigError, load_config
from horizonrl.envs import CustomEnv, Task, ToolError, format_answer, format_tool_call, get_env, tool
from horizonrl.envs.core.custom import tool_schema
from horizonrl.train.rollout.env_setup import env_setup
from horizonrl.trajectory import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "custom_env"


def _task(env: str, prompt: str = "q?", answer: str = "42", **fields: Any) -> Task:
    return Task(
        f"{env}-1", prompt, answer, (), {"env": env, "split": "train", "source": "file", "fields": fields}
    )


# -- schemas -------------------------------------------------------------------------------------------


def test_schema_from_type_hints_and_google_docstring():
    def lookup(
        self,
        query: str,
        limit: int = 5,
        mode: Literal["fast", "exact"] = "fast",
        tags: list[str] | None = None,
        score: float | None = None,
        strict: bool = False,
        extra: dict | None = None,
        anything: Any = None,
    ) -> str:
        """Search the catalogue for a product.

        Longer explanation that is not part of the description.

        Args:
            query: words to look for,
                continued on a second line
            limit (int): at most this many results
            mode: how to match
        Returns:
            the hits
        """

    t = tool_schema(lookup)
    assert t.name == "lookup" and t.description == "Search the catalogue for a product."
    assert t.parameters == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "words to look for, continued on a second line"},
            "limit": {"type": "integer", "description": "at most this many results", "default": 5},
            "mode": {
                "type": "string",
                "enum": ["fast", "exact"],
                "description": "how to match",
                "default": "fast",
            },
            "tags": {"type": "array", "items": {"type": "string"}},
            "score": {"type": "number"},
            "strict": {"type": "boolean", "default": False},
            "extra": {"type": "object"},
            "anything": {},
        },
        "required": ["query"],
    }


def test_schema_from_sphinx_params_and_overrides():
    def go(self, room: str) -> str:
        """Walk somewhere.

        :param room: where to go
        """

    t = tool_schema(go, name="walk", description="Move.")
    assert (t.name, t.description) == ("walk", "Move.")
    assert t.parameters["properties"]["room"] == {"type": "string", "description": "where to go"}


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(self, x): ...", "parameter 'x': needs a type hint"),
        ("def f(self, x: set): ...", "unsupported type hint"),
        ("def f(self, x: int | str): ...", "union"),
        ("def f(self, *args: int): ...", "must be named"),
        ("def f(self, x: Literal['a', 1]): ...", "Literal values"),
    ],
)
def test_bad_tool_declarations_fail_at_class_definition(source, message):
    ns: dict[str, Any] = {"Literal": Literal}
    exec(source, ns)
    with pytest.raises(TypeError, match=message):
        tool(ns["f"])


# -- a CustomEnv episode ---------------------------------------------------------------------------------


class Shop(CustomEnv):
    name = "test-shop"

    def setup(self, task):
        self.state["prices"] = dict(task.meta["fields"]["prices"])
        self.state["log"] = []

    @tool
    def price(self, item: str, units: int = 1) -> str:
        """The price of some units of an item.

        Args:
            item: the item
            units: how many
        """
        if item not in self.state["prices"]:
            raise ToolError(f"no item {item!r}")
        self.state["log"].append([item, units, type(units).__name__])
        return str(self.state["prices"][item] * units)

    @tool
    def catalogue(self) -> dict:
        """All items and prices."""
        return self.state["prices"]

    @tool
    def broken(self) -> str:
        """Always fails."""
        raise RuntimeError("boom")


def test_custom_env_runs_tools_and_grades_the_answer():
    env = Shop()
    assert [t.name for t in env.tools] == ["price", "catalogue", "broken"]
    assert env.reset(_task("test-shop", "Cost of 3 pens?", "6", prices={"pen": 2})) == "Cost of 3 pens?"
    # 3.0 is an integer value: it reaches the method as int 3 (validated by the shared tool parser).
    r = env.step(format_tool_call("price", {"item": "pen", "units": 3.0}))
    assert (r.observation, r.role, r.invalid, r.tool_calls, r.done) == ("6", "tool", False, 1, False)
    assert env.state["log"] == [["pen", 3, "int"]]
    assert env.step(format_tool_call("catalogue", {})).observation == '{"pen": 2}'
    bad = env.step(format_tool_call("price", {"item": "ink"}))
    assert bad.invalid and bad.observation == "Error: no item 'ink'"
    boom = env.step(format_tool_call("broken", {}))
    assert boom.invalid and boom.observation == "Error: broken failed: RuntimeError: boom"
    wrong_type = env.step(format_tool_call("price", {"item": 7}))
    assert wrong_type.invalid and 'argument "item" of price must be a string' in wrong_type.observation
    unknown = env.step(format_tool_call("nope", {}))
    assert unknown.invalid and "unknown tool" in unknown.observation
    # snapshot/restore come for free: the state is a deep copy
    snap = env.snapshot()
    env.step(format_tool_call("price", {"item": "pen"}))
    env.restore(snap)
    assert env.state["log"] == [["pen", 3, "int"]]
    done = env.step(format_answer("The 6."))  # normalized exact match: "the" and "." drop
    assert done.done and done.success and done.reward == 1.0 and done.final_answer == "The 6."


def test_custom_env_score_override_and_configured_reward():
    class Graded(Shop):
        name = "test-graded"

        def score(self, answer):
            return 0.5 if answer.strip() == "six" else super().score(answer)

    env = Graded()
    env.reset(_task("test-graded", answer="6", prices={}))
    res = env.step(format_answer("six"))
    assert res.reward == 0.5 and not res.success
    env = Shop()
    from horizonrl.rewards import make_reward

    env.set_reward(make_reward("token_f1"))
    env.reset(_task("test-shop", answer="six pens", prices={}))
    assert env.step(format_answer("six")).reward == pytest.approx(2 / 3)  # P=1, R=1/2


def test_custom_env_without_tasks_or_expert_says_so():
    with pytest.raises(ValueError, match="has no task generator"):
        Shop.make_tasks(3, seed=0)
    env = Shop()
    env.reset(_task("test-shop", prices={}))
    with pytest.raises(NotImplementedError, match="no scripted expert"):
        env.expert_action(random.Random(0))


# -- env.imports -----------------------------------------------------------------------------------------

MODULE = '''
from horizonrl.envs import CustomEnv, register_env, tool

@register_env("{name}")
class Echo(CustomEnv):
    @tool
    def echo(self, text: str) -> str:
        """Repeat the text."""
        return text
'''


def _tasks_file(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say {i}", "answer": str(i)}) + "\n" for i in range(30)))
    return path


def test_env_imports_a_module_on_sys_path(tmp_path, monkeypatch):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "envs.py").write_text(MODULE.format(name="test-echo-mod"))
    monkeypatch.syspath_prepend(str(tmp_path))
    tasks = _tasks_file(tmp_path)
    cfg = load_config(
        None, ["env.imports=mypkg.envs", "env.name=test-echo-mod", f"env.tasks={{path: {tasks}}}"]
    )
    setup = env_setup(cfg.env)
    assert setup.cls.__module__ == "mypkg.envs" and get_env("test-echo-mod") is setup.cls
    train, test = setup.tasks(100, seed=0, split="train"), setup.tasks(100, seed=0, split="test")
    assert len(train) + len(test) == 30 and train and test
    env = setup.make()
    env.reset(train[0])
    assert env.step(format_tool_call("echo", {"text": "hi"})).observation == "hi"
    sys.modules.pop("mypkg.envs", None)
    sys.modules.pop("mypkg", None)


def test_env_imports_a_file_path_once(tmp_path):
    path = tmp_path / "my_env.py"
    path.write_text(MODULE.format(name="test-echo-file"))
    tasks = _tasks_file(tmp_path)
    over = [f"env.imports=[{path}]", "env.name=test-echo-file", f"env.tasks={{path: {tasks}}}"]
    a = env_setup(load_config(None, over).env)
    b = env_setup(load_config(None, over).env)  # the same file again: the same class, no conflict
    assert a.cls is b.cls and a.cls.name == "test-echo-file"


@pytest.mark.parametrize(
    ("imports", "message"),
    [
        ("no_such_pkg.envs", "env.imports: cannot import 'no_such_pkg.envs': No module named 'no_such_pkg'"),
        ("missing/file.py", "env.imports: file 'missing/file.py' does not exist"),
    ],
)
def test_env_imports_errors_are_one_line(imports, message):
    cfg = load_config(None, [f"env.imports={imports}", "env.name=x"])
    with pytest.raises(ConfigError) as e:
        env_setup(cfg.env)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_an_error_inside_the_user_module_names_its_line(tmp_path):
    path = tmp_path / "broken_env.py"
    path.write_text("x = 1\nraise RuntimeError('bad env module')\n")
    with pytest.raises(ConfigError, match=rf"RuntimeError: bad env module \({path}:2\)"):
        env_setup(load_config(None, [f"env.imports={path}", "env.name=x"]).env)


def test_unknown_env_mentions_env_imports():
    with pytest.raises(ConfigError, match=r"env.name='nope': unknown environment; .*env.imports"):
        env_setup(load_config(None, ["env.name=nope"]).env)


# -- the documented example ------------------------------------------------------------------------------


def test_the_example_is_about_fifty_lines_and_documented():
    lines = (EXAMPLE / "warehouse.py").read_text().splitlines()
    assert len(lines) <= 60
    doc = (ROOT / "docs" / "custom_env.md").read_text()
    assert "examples/custom_env/warehouse.py" in doc and "env.imports" in doc


def test_the_example_expert_solves_its_tasks(monkeypatch):
    monkeypatch.chdir(ROOT)
    setup = env_setup(load_config(str(EXAMPLE / "config.yaml")).env)
    tasks = setup.tasks(100, seed=0, split="train") + setup.tasks(100, seed=0, split="test")
    assert len(tasks) == 40
    rng = random.Random(0)
    for task in tasks:
        env = setup.make()
        env.reset(task)
        for _ in range(6):
            res = env.step(env.expert_action(rng))
            if res.done:
                break
        assert res.success, task.id


def test_the_example_trains_two_steps_on_the_tiny_model(tiny_model_dir, tmp_path, monkeypatch):
    from horizonrl.train.records.metrics import read_metrics
    from horizonrl.train.trainers.group import GroupTrainer

    monkeypatch.chdir(ROOT)  # the example's paths are relative to the repository root
    cfg = load_config(
        str(EXAMPLE / "config.yaml"),
        [
            f"model.path={tiny_model_dir}",
            "rollout.group_size=2",
            "rollout.tasks_per_step=2",
            "rollout.max_new_tokens=16",
            "rollout.max_turns=2",
            "rollout.context_budget=768",
            "train.steps=2",
            "train.eval_samples=1",
            "env.test_tasks=2",
            "train.progress=false",
            f"train.out_dir={tmp_path / 'run'}",
        ],
    )
    trainer = GroupTrainer(cfg)
    assert trainer.env_cls.name == "warehouse" and len(trainer.train_tasks) == 32
    trainer.fit()
    metrics = read_metrics(tmp_path / "run")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    rollouts = list(read_jsonl(tmp_path / "run" / "rollouts" / "step_1.jsonl"))
    assert len(rollouts) == 4 and all(r.env["name"] == "warehouse" for r in rollouts)
    assert {r.task_id for r in rollouts} <= {t.id for t in trainer.train_tasks}
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "examples/custom_env/warehouse.py" in saved  # a resumed run imports the module again


def test_sft_and_eval_recipes_take_the_example_from_its_config(tiny_model_dir, tmp_path, monkeypatch):
    """`horizonrl sft` (demonstrations from the example's expert) and `horizonrl eval` on its test rows."""
    from horizonrl.train.recipes import evaluate_model, run_sft

    monkeypatch.chdir(ROOT)
    over = [
        f"model.path={tiny_model_dir}",
        "sft.demos=6",
        "sft.epochs=1",
        "sft.batch_size=6",
        f"sft.out_dir={tmp_path / 'sft'}",
        "rollout.max_new_tokens=16",
        "rollout.max_turns=5",
        "rollout.context_budget=768",
        "env.test_tasks=3",
        "train.eval_samples=1",
    ]
    cfg = load_config(str(EXAMPLE / "config.yaml"), over)
    out = run_sft(cfg)
    demos = [json.loads(line) for line in (out / "demos.jsonl").read_text().splitlines()]
    assert len(demos) == 6 and all(d["success"] for d in demos)
    assert {t["function"]["name"] for t in demos[0]["tools"]} == {"rooms", "count"}
    result = evaluate_model(cfg, out)
    assert 0.0 <= result["eval/pass@1"] <= 1.0


def test_the_cli_imports_env_imports_before_checking_env_name(tiny_model_dir, tmp_path):
    """A fresh process (nothing imported yet): `horizonrl train -c examples/custom_env/config.yaml` must
    import the example's module before looking up env.name (it once failed with 'unknown environment')."""
    import subprocess

    cmd = [
        sys.executable,
        "-m",
        "horizonrl.cli",
        "train",
        "-c",
        "examples/custom_env/config.yaml",
        f"model.path={tiny_model_dir}",
        "train.steps=1",
        "train.eval_samples=1",
        "env.test_tasks=1",
        "rollout.group_size=2",
        "rollout.tasks_per_step=1",
        "rollout.max_new_tokens=8",
        "rollout.max_turns=1",
        "train.progress=false",
        f"train.out_dir={tmp_path / 'run'}",
    ]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
