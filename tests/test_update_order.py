"""The optimizer's updates moved to just after their gradients (`ir.update_order`): the same
kernels and values, each update after everything that writes or reads its operands, in a few
groups (each still one multi-tensor run); the planner takes that order under a budget below
the peak where asked ("auto": `autotm optimize`, `autotm train`, the Trainer), and a plan of it
is rebuilt from its file."""

from __future__ import annotations

import json

import pytest
import torch

from autotm_py import api
from autotm_py.cli import main
from autotm_py.config import PlanConfig
from autotm_py.errors import ConfigError
from autotm_py.ir import Optimizer
from autotm_py.ir.training import derive_training
from autotm_py.ir.update_order import UPDATE_OPS, early_order, update_tail, updates_early
from autotm_py.options import ModelOptions, RunMode
from autotm_py.pipeline import optimize
from autotm_py.runtime.execute import run_steps
from autotm_py.runtime.reference import train_steps
from autotm_py.workload import planned_graph
from tests.graphs import costs_for
from tests.test_training_models import small_cnn

SGD = Optimizer("sgd", 0.05, momentum=0.9, lr_input=True)
ADAMW = Optimizer("adamw", 1e-3, weight_decay=1e-2)


def _graph(opt: Optimizer = SGD):
    return derive_training(small_cnn(), optimizer=opt)


def _update_runs(graph) -> list[int]:
    runs: list[int] = []
    previous_was_update = False
    for k in graph.kernels:
        is_update = k.op_type in UPDATE_OPS
        if is_update:
            if previous_was_update:
                runs[-1] += 1
            else:
                runs.append(1)
        previous_was_update = is_update
    return runs


@pytest.mark.parametrize("opt", [SGD, ADAMW], ids=["sgd", "adamw"])
def test_each_update_follows_its_gradient_and_nothing_else_moves(opt):
    graph = _graph(opt)
    assert update_tail(graph) < len(graph.kernels) - 1  # derived: every update at the end
    early = updates_early(graph, groups=3)
    assert early.meta["updates_early"] and updates_early(early) is early
    assert sorted(k.name for k in early.kernels) == sorted(k.name for k in graph.kernels)
    others = [k.name for k in graph.kernels if k.op_type not in UPDATE_OPS]
    assert [k.name for k in early.kernels if k.op_type not in UPDATE_OPS] == others
    first_update = min(k.id for k in early.kernels if k.op_type in UPDATE_OPS)
    assert first_update < update_tail(graph)  # some ran before the backward ended
    for k in early.kernels:
        if k.op_type not in UPDATE_OPS:
            continue
        for tid in k.inputs:  # after its operands' producers and their other readers
            t = early.tensors[tid]
            assert t.producer is None or t.producer < k.id
            assert all(u <= k.id or early.kernels[u].op_type in UPDATE_OPS for u in t.users)
    assert len(_update_runs(early)) <= 3 + 1
    if opt is ADAMW:  # the step's coefficients before every update that reads them
        step = next(k.id for k in early.kernels if k.op_type == "AdamStep")
        assert step == first_update


def test_a_graph_without_trailing_updates_is_left_as_it_is():
    inference = small_cnn()
    assert early_order(inference) is None and updates_early(inference) is inference


@pytest.mark.parametrize("opt", [SGD, ADAMW], ids=["sgd", "adamw"])
def test_the_early_order_computes_what_the_end_order_computes(opt):
    graph = _graph(opt)
    early = updates_early(graph, groups=4)
    for got, want in zip(train_steps(early, 3, seed=2), train_steps(graph, 3, seed=2),
                         strict=True):
        for tid in graph.outputs:
            assert torch.equal(got[tid], want[tid]), graph.name_of(tid)


def test_reordered_costs_follow_their_kernels():
    graph = _graph()
    costs = costs_for(graph)
    order = early_order(graph)
    moved = costs.reordered(order)
    early = updates_early(graph)
    assert [k.name for k in early.kernels] == [graph.kernels[o].name for o in order]
    assert list(moved.times_s) == [costs.times_s[o] for o in order]
    assert moved.times_s != costs.times_s  # something moved


def _budget(graph) -> int:
    lo, hi = graph.max_working_set[0], graph.peak_live_bytes
    return (lo + hi) // 2


def test_auto_plans_the_early_order_under_a_budget_and_it_runs_as_the_reference():
    graph = _graph()
    costs = costs_for(graph)
    config = PlanConfig(fast_mem_bytes=_budget(graph), device="cuda", run=RunMode(),
                        update_order="auto")
    result = optimize(graph, config, costs=costs)
    assert result.plan is not None, result.message
    early = result.graph
    assert early is not None and early.meta["updates_early"]
    assert result.plan.header.model.updates_early
    # the file's options rebuild the order (`autotm run --plan`, `simulate`, the plan cache)
    rebuilt = planned_graph(graph, result.plan)
    assert [k.name for k in rebuilt.kernels] == [k.name for k in early.kernels]
    reference = train_steps(graph, 3, seed=3)
    for got, want in zip(run_steps(early, result.plan, steps=3, seed=3), reference,
                         strict=True):
        for tid in graph.outputs:
            assert torch.equal(got[tid], want[tid]), graph.name_of(tid)


def test_a_ratio_is_of_the_graph_as_given():
    """The reordered graph's peak may differ from the given one's: the ratio's budget in bytes
    is the given graph's, and the plan records the ratio as asked."""
    graph = _graph()
    costs = costs_for(graph)
    end = optimize(graph, PlanConfig(ratio="1:1", device="cuda", run=RunMode()), costs=costs)
    early = optimize(graph, PlanConfig(ratio="1:1", device="cuda", run=RunMode(),
                                       update_order="auto"), costs=costs)
    assert early.graph is not None and early.graph.meta["updates_early"]
    assert early.budget_bytes == end.budget_bytes == early.plan.header.budget_bytes
    assert early.plan.header.config["ratio"] == "1:1"
    assert early.plan.header.config["update_order"] == "auto"


def test_auto_keeps_the_end_order_without_a_budget_and_end_is_the_api_default():
    graph = _graph()
    costs = costs_for(graph)
    unbounded = optimize(graph, PlanConfig(ratio="1:0", device="cuda", update_order="auto"),
                         costs=costs)
    assert unbounded.graph is None
    default = optimize(graph, PlanConfig(fast_mem_bytes=_budget(graph), device="cuda"),
                       costs=costs)
    assert default.graph is None and not default.plan.header.model.updates_early


def test_a_bad_update_order_is_refused_by_name():
    with pytest.raises(ConfigError, match="--update-order 'soon': choose one of auto, early"):
        PlanConfig(update_order="soon")


def test_the_model_options_record_the_order():
    early = updates_early(_graph())
    assert ModelOptions.of_graph(early).updates_early
    assert not ModelOptions.of_graph(_graph()).updates_early


@pytest.fixture()
def cnn(monkeypatch):
    """`autotm ... cnn` loads the small CNN's training graph (as tests/fixtures/cli.py)."""
    graph = _graph()
    monkeypatch.setattr(api, "load_model", lambda *a, **k: graph)
    monkeypatch.setattr(api, "load_costs",
                        lambda g, device="cuda", profiles_dir=None, gpu=None:
                        costs_for(g, device))
    return graph


def test_the_cli_plans_the_early_order_and_simulate_rebuilds_it(cnn, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    budget = str(_budget(cnn))
    assert main(["optimize", "cnn", "--fast-mem", budget, "--no-baselines",
                 "-o", str(plan)]) == 0
    assert json.loads(plan.read_text())["header"]["model"]["updates_early"] is True
    assert main(["simulate", "cnn", "--plan", str(plan)]) == 0
    assert "verified" in capsys.readouterr().out
    assert main(["optimize", "cnn", "--fast-mem", budget, "--no-baselines",
                 "--update-order", "end", "-o", str(plan)]) == 0
    assert json.loads(plan.read_text())["header"]["model"]["updates_early"] is False
