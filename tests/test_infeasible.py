"""Infeasible budgets say why, and every face states one smallest budget (issue 45 item 5,
issue 47 item 3).

`planning.feasibility.smallest_budget` computes the smallest feasible budget with its parts
(the kernel's bytes, the runtime reserve, the arena's scratch region or the kernel's scratch
window, the bytes held back for the arena's packing, the headroom) and which of them a budget
cannot hold; optimize's result line, inspect's useful budgets, bench rows and the Trainer's
error format that one figure.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autotm_py import api, pipeline
from autotm_py.bench import run_bench
from autotm_py.cli import main
from autotm_py.config import PlanConfig
from autotm_py.errors import ConfigError
from autotm_py.options import ModelOptions, RunMode
from autotm_py.planning import SolveControl, solve
from autotm_py.planning.feasibility import size_at_least, smallest_budget
from autotm_py.trainer import Trainer
from autotm_py.units import format_bytes, parse_bytes
from tests.graphs import costs_for, small_training
from tests.test_report_support import tiny_onnx

MIB = 1 << 20
PLAIN = RunMode()
REGION = RunMode(arena=True, placed=False)
WINDOWS = RunMode(arena=True, placed=True, scratch="windows")


@pytest.fixture(scope="module")
def graph():
    # the Gemm's 2 MiB workspace forces the smallest budget, and gets a scratch window
    return small_training(kib=256, workspace_kib=2048)


def _optimize(graph, run, budget, **kw):
    config = PlanConfig(run=run, fast_mem_bytes=budget, strategy="sync", recompute="off", **kw)
    return api.optimize(graph, config, costs=costs_for(graph))


def _least(graph, run, **kw):
    config = PlanConfig(run=run, strategy="sync", recompute="off", **kw)
    return api.useful_budgets(graph, config, costs=costs_for(graph))[0]


@pytest.mark.parametrize("run", [PLAIN, REGION, WINDOWS], ids=["plain", "region", "windows"])
def test_the_smallest_budget_is_exact_and_the_one_optimize_names(graph, run):
    least = _least(graph, run, reserve_bytes=MIB)
    below = _optimize(graph, run, least.budget_bytes - 1, reserve_bytes=MIB)
    assert below.status == "infeasible" and below.smallest == least
    assert below.min_feasible_budget_bytes == least.budget_bytes
    assert below.forcing_kernel == least.kernel
    # its workspace counts beside its tensors, else in the scratch region it sets
    assert (least.op_type if run != REGION else least.scratch_kernel_name) in ("Gemm", "Gemm_0")
    assert f"smallest feasible budget of {format_bytes(least.budget_bytes)}" in below.message
    assert f"give --fast-mem {size_at_least(least.budget_bytes)} or more" in below.message
    assert _optimize(graph, run, least.budget_bytes, reserve_bytes=MIB).plan is not None


def test_each_part_that_does_not_fit_is_named_with_its_fix(graph):
    # the reserve: the kernel's bytes fit, with the 1 MiB reserve beside them they do not
    least = _least(graph, PLAIN, reserve_bytes=MIB)
    assert least.causes(least.budget_bytes - 1) == ("reserve",)
    text = least.message(least.budget_bytes - 1)
    assert "what does not fit is the runtime reserve of memory system 'h100-pcie5'" in text
    assert "--reserve BYTES" in text
    # the kernel itself: nothing beside it is to blame
    assert least.causes(least.plan_bytes - 1) == ()
    assert "what does not fit" not in least.message(least.plan_bytes - 1)
    # the scratch region (copied outputs and workspace, kept for the whole iteration)
    least = _least(graph, REGION)
    assert least.scratch_bytes >= 2 * MIB and least.causes(least.budget_bytes - 1) == ("scratch",)
    text = least.message(least.budget_bytes - 1)
    assert "what does not fit is the arena's scratch region" in text
    assert "--scratch windows" in text and "--no-arena" in text
    assert "Trainer" not in text and "mode=RunMode(replay=True)" in \
        least.message(least.budget_bytes - 1, face="trainer")
    # the scratch window: the kernel's scratch beyond its workspace (1 MiB of slack at least)
    least = _least(graph, WINDOWS)
    assert least.window_bytes >= MIB and "window" in least.causes(least.budget_bytes - 1)
    assert "what does not fit is the kernel's scratch window" in \
        least.message(least.budget_bytes - 1)
    # the headroom
    least = _least(graph, PLAIN, headroom=0.3)
    assert least.causes(least.budget_bytes - 1) == ("headroom",)
    assert "a smaller --headroom" in least.message(least.budget_bytes - 1)


def test_the_packings_holes_held_back_say_what_budget_would_hold_them(graph):
    machine = pipeline.machine_for(graph, PlanConfig(run=WINDOWS, fast_mem_bytes=0),
                                   costs_for(graph))
    first = smallest_budget(machine, "sync")
    held = replace(machine, memory=machine.memory.with_budget(first.budget_bytes),
                   arena_margin=MIB)
    result = solve.plan(held, PlanConfig(run=WINDOWS, strategy="sync", recompute="off"),
                        SolveControl())
    least = result.smallest
    assert result.status == "infeasible" and least.margin_bytes == MIB
    assert least.budget_bytes == first.budget_bytes + MIB
    assert least.causes(first.budget_bytes) == ("margin",)
    assert "held back so that the arena's packing fits" in result.message
    note = solve.packing_note(result)
    assert note.startswith("no arena: with the packing's holes held back (1.00 MiB)")
    assert f"--fast-mem {size_at_least(least.budget_bytes)} or more" in note


@pytest.mark.parametrize("flags", [[], ["--no-arena"], ["--no-placed"], ["--scratch", "region"]])
def test_inspect_and_optimize_state_one_figure(net, flags, capsys):
    assert main(["inspect", "net", "--json", *flags]) == 0
    lo = json.loads(capsys.readouterr().out)["budget_interval_bytes"][0]
    assert main(["inspect", "net", "--json", "--kernels", *flags]) == 0  # the kernel report
    assert json.loads(capsys.readouterr().out)["sweep_bytes"][0] == lo
    assert main(["optimize", "net", "--fast-mem", str(lo - 1), "--no-baselines", "--json",
                 *flags]) == 3
    data = json.loads(capsys.readouterr().out)
    assert data["min_feasible_budget_bytes"] == lo == data["smallest"]["budget_bytes"]
    assert main(["optimize", "net", "--fast-mem", str(lo - 1), "--no-baselines", *flags]) == 3
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("result"))
    assert f"smallest feasible budget of {format_bytes(lo)} ({lo} bytes" in line
    assert "forced by kernel #" in line and "; give --fast-mem " in line


def test_a_bench_row_says_why_in_its_columns_and_table(tmp_path, capsys):
    model = tiny_onnx(tmp_path / "tiny.onnx", hidden=128, layers=3)
    from autotm_py.bench import BenchSpec

    spec = BenchSpec(models=(str(model),), ratios=("1:2",), strategies=("sync",),
                     device="cuda", model=ModelOptions(training=True))
    row, = run_bench(spec, tmp_path / "b.csv", workers=1).rows
    graph = api.load_model(model, training=True)
    config = spec.plan_config("sync", "1:2")
    least = api.useful_budgets(graph, config, costs=api.load_costs(graph, device="cuda"))[0]
    assert row["status"] == "infeasible"
    assert row["min_feasible_budget_bytes"] == least.budget_bytes > row["budget_bytes"]
    assert row["forced_by"].startswith(f"kernel #{least.kernel} {least.op_type}")
    assert row["notes"].startswith("infeasible: the budget of ")
    assert main(["bench", "--models", str(model), "--ratios", "1:2", "--strategies", "sync",
                 "--training", "--precision", "fp32", "--no-progress",
                 "-o", str(tmp_path / "c.csv")]) == 0
    out = capsys.readouterr().out
    assert f"needs {format_bytes(least.budget_bytes)}: kernel #{least.kernel}" in out


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_the_trainer_names_the_smallest_budget_and_its_own_fix(tmp_path):
    torch.manual_seed(0)
    module = _Net()
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    example = (torch.randn(8, 32), torch.randint(0, 10, (8,)))
    with pytest.raises(ConfigError) as caught:
        Trainer(module, opt, F.cross_entropy, example=example, budget="1KiB", device="cpu",
                plans_dir=tmp_path)
    text = str(caught.value)
    assert text.startswith("Trainer: infeasible: the budget of 1.00 KiB is below the smallest "
                           "feasible budget of ")
    assert "forced by kernel #" in text and "\n" not in text
    given = text.rsplit("give budget='", 1)[1].split("'")[0]
    assert parse_bytes(given) >= int(text.split(" bytes")[0].rsplit("(", 1)[1])
    Trainer(module, opt, F.cross_entropy, example=example, budget=given, device="cpu",
            plans_dir=tmp_path)  # the budget it names is enough


def test_the_status_lines_last_objective_is_the_summarys(net, capsys):
    seen = []
    control = SolveControl()
    control.on_progress = lambda p: seen.append(p.incumbent) if p.incumbent else None
    result = api.optimize(net, PlanConfig(fast_mem_bytes=900 << 10), costs=costs_for(net),
                          control=control)
    assert seen and seen[-1] == pytest.approx(result.stats.objective_s * 1e3)
    assert main(["optimize", "net", "--fast-mem", "900KiB", "--no-baselines"]) == 0
    out = capsys.readouterr().out
    assert f"objective {result.stats.objective_s * 1e3:.3f} ms, gap " in out


def test_a_trainer_plan_left_without_its_arena_says_so_in_the_notes(graph):
    from autotm_py.runtime.reference import init_values
    from autotm_py.trainer.loop import Loop

    plan = _optimize(graph, PLAIN, 64 * MIB).plan
    plan = plan.with_header(notes=(*plan.header.notes, "no arena: with the packing's holes "
                                   "held back (1.00 MiB) the budget ..."))
    loop = Loop(graph, plan, "cpu", RunMode(), init_values(graph))
    assert any(n.startswith("no arena: with the packing's holes") for n in loop.notes)
