"""The run's workspace (train/trainers/workspace.py): built once, held by every trainer, documented."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pickle

import pytest

from helpers.shaped_env import arith_run_config
from horizonrl.train.methods.reverse_turn import ReverseTurnTrainer, Sweep
from horizonrl.train.methods.rtpo import RTPOTrainer
from horizonrl.train.methods.seeupo import SeeUPOTrainer
from horizonrl.train.trainers import features, workspace
from horizonrl.train.trainers.group import GroupTrainer
from horizonrl.train.trainers.registry import async_trainers
from horizonrl.train.trainers.train_context import TRAIN_CONTEXTS, train_context_view
from horizonrl.train.trainers.workspace import RunWorkspace, WorkspaceTrainer


def _field_docstrings(module, cls_name: str) -> dict[str, bool]:
    """``field -> has a docstring right under it`` for the annotated fields of ``cls_name``."""
    tree = ast.parse(inspect.getsource(module))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name)
    out = {}
    for i, node in enumerate(cls.body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            nxt = cls.body[i + 1] if i + 1 < len(cls.body) else None
            out[node.target.id] = (
                isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            )
    return out


def test_every_workspace_field_is_documented():
    docs = _field_docstrings(workspace, "RunWorkspace")
    assert set(docs) == {f.name for f in dataclasses.fields(RunWorkspace)}
    assert all(docs.values()), [f for f, ok in docs.items() if not ok]


def test_feature_context_fields_are_typed_and_documented():
    docs = _field_docstrings(features, "FeatureContext")
    assert all(docs.values()), [f for f, ok in docs.items() if not ok]
    untyped = [f.name for f in dataclasses.fields(features.FeatureContext) if "Any" in str(f.type)]
    assert untyped == ["state"]  # the provider's own storage


def test_trainers_hold_the_workspace_instead_of_inheriting_one_another():
    for cls in (GroupTrainer, ReverseTurnTrainer, RTPOTrainer, SeeUPOTrainer):
        assert issubclass(cls, WorkspaceTrainer)
    for cls in (ReverseTurnTrainer, RTPOTrainer, SeeUPOTrainer):
        assert not issubclass(cls, GroupTrainer)
    assert async_trainers() == ["group"]


def test_training_context_views_are_registered_by_name():
    assert train_context_view("exact")("r", None) == "r"
    from horizonrl.agents.psi import flat_view

    assert train_context_view("flat") is flat_view  # registered by methods/rtpo.py
    assert {"exact", "flat"} <= set(TRAIN_CONTEXTS.names())


def test_reverse_turn_checkpoints_written_before_the_move_still_load():
    """A checkpoint pickles :class:`Sweep` by module name; the name it had before issue 43 resolves."""
    old = pickle.dumps(Sweep(iteration=1, stages=[0], data={}), protocol=0).replace(
        b"horizonrl.train.methods.reverse_turn", b"horizonrl.train.trainers.reverse_turn"
    )
    assert b"horizonrl.train.trainers.reverse_turn" in old
    assert pickle.loads(old) == Sweep(iteration=1, stages=[0], data={})
    assert importlib.import_module("horizonrl.train.trainers.reverse_turn") is importlib.import_module(
        "horizonrl.train.methods.reverse_turn"
    )


@pytest.fixture(scope="module")
def trainer(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ws") / "run"
    cfg = arith_run_config(tiny_model_dir, out, "train.steps=2", "train.max_staleness=1")
    tr = GroupTrainer(cfg)
    yield tr
    tr.close()


def test_the_trainer_reads_its_parts_from_the_workspace(trainer):
    ws = trainer.ws
    for name in (
        "cfg",
        "model",
        "engine",
        "tokenizer",
        "renderer",
        "budget",
        "optimizer",
        "task_rng",
        "logger",
    ):
        assert getattr(trainer, name) is getattr(ws, name), name
    assert trainer.run_dir == ws.run_dir and trainer.spec is ws.spec
    assert trainer.loss_agg_mode == ws.update_settings.loss_agg_mode == trainer.estimator.loss_agg_mode
    with pytest.raises(AttributeError):
        trainer.model = None  # read-only views: the workspace is built once


def test_async_rollouts_get_what_they_use_explicitly(trainer):
    a = trainer.async_rollouts
    assert not hasattr(a, "trainer")
    assert a.budget is trainer.budget and a.tasks is trainer.task_sampler and a.tasks.rng is trainer.task_rng
    assert a.engine is not trainer.engine  # its own engine (engine_factory)
    assert a.spec.renderer is not trainer.renderer  # one tokenizer per thread
    assert dataclasses.replace(a.spec, renderer=trainer.renderer) == trainer.spec
