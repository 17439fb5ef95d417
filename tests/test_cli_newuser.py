"""The first hour of a new user (issue 12 items 1, 4 and 6; issue 17 item 2), through the CLI:
budgets that add up with the runtime reserve, plans that remember their model options and
costs, and one clean line for every bad input, checked before long work starts."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from autotm_py import api
from autotm_py.cli import main
from autotm_py.config import PlanConfig
from autotm_py.errors import ConfigError
from autotm_py.plan import Plan
from autotm_py.report.plots import plot_memory
from autotm_py.report.residency import PlanView, walk
from autotm_py.report.timeline import plan_order_timeline
from autotm_py.units import parse_ratio
from tests.graphs import costs_for


def mlp_onnx(path: Path, *, hidden: int = 64, external: bool = True) -> str:
    """An MLP with a symbolic batch (default 4) whose weights live in `<stem>.weights.bin`."""
    nodes, inits, prev = [], [], "x"
    for i in range(2):
        inits.append(numpy_helper.from_array(np.full((hidden, hidden), 0.01, np.float32),
                                             f"w{i}"))
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu{i}")]
        prev = f"r{i}"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", hidden])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["batch", hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    helper.set_model_props(model, {"autotm.default_dims": json.dumps({"batch": 4})})
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=f"{path.stem}.weights.bin",
                        size_threshold=0)
    else:
        onnx.save(model, str(path))
    return str(path)


@pytest.fixture()
def mlp(tmp_path):
    return mlp_onnx(tmp_path / "mlp.onnx")


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    return err


# ---- 12.1: the runtime reserve -----------------------------------------------------------------
@pytest.mark.runtime_reserve
def test_optimize_summary_adds_up_and_names_the_reserve(net, capsys):
    # without an arena: its scratch region is a part of its own (tests/test_arena.py)
    assert main(["optimize", "net", "--fast-mem", "70MiB", "--no-baselines", "--no-arena"]) == 0
    out = capsys.readouterr().out
    assert "budget     70.00 MiB" in out
    assert "= 68.00 MiB runtime reserve + 0 B headroom + 2.00 MiB for the plan's tensors" in out
    assert "with the reserve, budget 70.00 MiB" in out
    assert main(["optimize", "net", "--fast-mem", "70MiB", "--no-baselines", "--json",
                 "--no-arena"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["reserve_bytes"] == 68 << 20 and data["plannable_bytes"] == 2 << 20


@pytest.mark.runtime_reserve
def test_infeasible_because_of_the_reserve_says_so_and_reserve_option_fixes_it(net, capsys):
    assert main(["optimize", "net", "--ratio", "2:1", "--no-baselines"]) == 3
    out = capsys.readouterr().out
    assert "the runtime reserve of memory system 'h100-pcie5'" in out and "--reserve" in out
    assert "(the reserve alone exceeds the budget)" in out
    assert main(["optimize", "net", "--ratio", "2:1", "--no-baselines", "--reserve", "0"]) == 0
    assert "= 0 B runtime reserve" in capsys.readouterr().out
    assert main(["optimize", "net", "--ratio", "1:1", "--reserve", "lots"]) == 2
    assert _err(capsys).startswith("error: --reserve 'lots'")


@pytest.mark.runtime_reserve
def test_inspect_budgets_include_the_reserve(net, capsys):
    assert main(["inspect", "net", "--json", "--no-arena"]) == 0
    data = json.loads(capsys.readouterr().out)
    lo, hi = data["tensor_interval_bytes"]
    assert data["runtime_reserve_bytes"] == 68 << 20
    assert data["budget_interval_bytes"] == [lo + (68 << 20), hi + (68 << 20)]
    assert main(["inspect", "net", "--json", "--arena"]) == 0  # and the scratch region
    data = json.loads(capsys.readouterr().out)
    lo, hi = data["tensor_interval_bytes"]
    extra = (68 << 20) + data["smallest_budget"]["scratch_bytes"]
    assert data["budget_interval_bytes"] == [lo + extra, hi + extra]
    assert main(["inspect", "net"]) == 0
    out = capsys.readouterr().out
    assert "68.00 MiB runtime reserve" in out and "ratios       none but 1:0" in out
    assert main(["inspect", "net", "--memory", "optane", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runtime_reserve_bytes"] == 0
    assert main(["inspect", "net", "--reserve", "1MiB", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runtime_reserve_bytes"] == 1 << 20


@pytest.mark.runtime_reserve
def test_memory_plot_shows_budget_and_reserve_inside_the_axis(net):
    result = api.optimize(net, PlanConfig(fast_mem_bytes=70 << 20, headroom=0.01),
                          costs=costs_for(net))
    plan = result.plan
    timeline = plan_order_timeline(plan, walk(plan, PlanView.from_plan(plan)))
    assert timeline.reserve_bytes == 68 << 20 and timeline.headroom_bytes > 0
    fig = plot_memory(timeline)
    ax = fig.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert any(label.startswith("runtime reserve 68") for label in labels)
    assert any(label.startswith("budget less headroom") for label in labels)
    budget_line = next(line for line in ax.get_lines()
                       if line.get_label().startswith("budget "))
    assert budget_line.get_ydata()[0] < ax.get_ylim()[1]  # not on or off the frame


# ---- 12.4: model options come from the plan --------------------------------------------------
def test_simulate_run_report_take_model_options_from_the_plan(mlp, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main(["optimize", mlp, "--batch", "8", "--training", "--optimizer", "adam",
                 "--ratio", "3:1", "--no-baselines", "--no-arena", "-o", str(plan)]) == 0
    header = Plan.load(plan).header
    assert header.model.batch == 8 and header.model.optimizer == "adam"
    capsys.readouterr()
    assert main(["simulate", mlp, "--plan", str(plan)]) == 0
    assert "verified" in capsys.readouterr().out
    assert main(["report", str(plan), "--model", mlp, "-o", str(tmp_path / "rep"),
                 "--format", "svg"]) == 0
    capsys.readouterr()
    assert main(["run", mlp, "--plan", str(plan), "--device", "cpu", "--iterations", "1",
                 "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "kernel times in it are roofline estimates" in out  # no profile has this MLP
    assert "weights: the file's own weights (2)" in out  # the MLP file holds its two
    assert main(["simulate", mlp, "--plan", str(plan), "--batch", "16"]) == 1
    err = _err(capsys)
    assert "batch 16 (the plan's: 8)" in err and err.count("\n") == 0
    assert main(["simulate", mlp, "--plan", str(plan), "--optimizer", "sgd"]) == 1
    assert "optimizer 'sgd' (the plan's: 'adam')" in _err(capsys)


def test_run_says_a_missing_weights_file_is_missing(mlp, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main(["optimize", mlp, "--ratio", "1:0", "--no-baselines", "-o", str(plan)]) == 0
    (tmp_path / "mlp.weights.bin").unlink()
    capsys.readouterr()
    assert main(["run", mlp, "--plan", str(plan), "--device", "cpu", "--iterations", "1",
                 "--warmup", "0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "external data mlp.weights.bin is missing" in data["weights"]


# ---- 17.2: costs that changed since the plan was made --------------------------------------
def test_changed_costs_warn_with_how_far_the_prediction_moved(net, tmp_path, capsys,
                                                              monkeypatch):
    plan = tmp_path / "plan.json"
    assert main(["optimize", "net", "--fast-mem", "900KiB", "-o", str(plan),
                 "--no-baselines"]) == 0
    assert Plan.load(plan).header.costs.digest == costs_for(net).digest
    capsys.readouterr()
    assert main(["simulate", "net", "--plan", str(plan), "-o", str(tmp_path / "t.json")]) == 0
    assert "warning" not in capsys.readouterr().err
    slower = costs_for(net)
    slower = replace(slower, times_s=tuple(1.5 * t for t in slower.times_s))
    monkeypatch.setattr(api, "load_costs",
                        lambda g, device="cuda", profiles_dir=None, gpu=None: slower)
    assert main(["simulate", "net", "--plan", str(plan)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: today's kernel costs differ")
    moved = re.search(r"moved from [\d.]+ ms to [\d.]+ ms \((\+[\d.]+)%\)", err[0])
    assert moved and 40 < float(moved.group(1)) <= 50  # kernels 1.5x, copies unchanged
    assert main(["report", str(plan), "--model", "net", "-o", str(tmp_path / "r"),
                 "--format", "svg"]) == 0
    assert f"({moved.group(1)}%)" in capsys.readouterr().err
    assert main(["simulate", "net", "--plan", str(plan), "--json"]) == 0
    assert f"({moved.group(1)}%)" in json.loads(capsys.readouterr().out)["costs_warning"]


# ---- 12.6: the smaller ones --------------------------------------------------------------------
def test_report_refuses_a_truncated_plan(net, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main(["optimize", "net", "--fast-mem", "900KiB", "-o", str(plan),
                 "--no-baselines"]) == 0
    doc = json.loads(plan.read_text())
    n = len(doc["records"])
    doc["records"] = doc["records"][: n // 2]
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["report", str(cut), "-o", str(tmp_path / "r")]) == 1
    err = _err(capsys)
    assert "is incomplete" in err and "truncated" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("argv", [
    ["optimize", "net", "--fast-mem", "900KiB", "-o", "{bad}/plan.json"],
    ["simulate", "net", "--plan", "{plan}", "-o", "{bad}/timeline.json"],
    ["run", "net", "--plan", "{plan}", "--device", "cpu", "-o", "{bad}/run.json"],
    ["report", "{plan}", "-o", "{bad}/report"],
    ["report", "{plan}", "-o", "{tmp}/r", "--trace", "{bad}/trace.json"],
    ["bench", "--models", "net", "--ratios", "1:1", "-o", "{bad}/bench.csv"],
    ["zoo", "export", "resnet50", "-o", "{bad}/resnet50.onnx"],
    ["inspect", "net", "--csv", "{bad}/k.csv"],
])
def test_unwritable_outputs_fail_before_any_work(argv, net, tmp_path, capsys, monkeypatch):
    plan = tmp_path / "plan.json"
    api.optimize(net, PlanConfig(fast_mem_bytes=900 << 10), costs=costs_for(net)).plan.save(plan)
    (tmp_path / "file").write_text("a file, not a folder")

    def no_work(*_a, **_k):
        raise AssertionError("work started before the output path was checked")

    for name in ("optimize", "simulate", "execute"):
        monkeypatch.setattr(api, name, no_work)
    subs = {"bad": str(tmp_path / "file"), "plan": str(plan), "tmp": str(tmp_path)}
    assert main([a.format(**subs) for a in argv]) == 2
    assert "cannot write there" in _err(capsys)


def test_plan_config_takes_ratio_strings_and_refuses_other_types():
    assert PlanConfig(ratio="1:4").ratio == parse_ratio("1:4")
    assert PlanConfig(fast_mem_bytes="1GiB").fast_mem_bytes == 2**30
    with pytest.raises(ConfigError, match=r"ratio 0\.25"):
        PlanConfig(ratio=0.25)
    with pytest.raises(ConfigError, match="ratio '1/4'"):
        PlanConfig(ratio="1/4")


def test_absurd_dims_are_refused(tmp_path, capsys):
    path = mlp_onnx(tmp_path / "m.onnx", external=False)
    assert main(["inspect", path, "--dim", "batch=100000000000"]) == 2
    err = _err(capsys)
    assert "more than 32.00 TiB" in err and "batch=100000000000" in err


def test_bench_prints_a_table(tmp_path, capsys):
    path = mlp_onnx(tmp_path / "m.onnx", external=False)
    out = tmp_path / "b.csv"
    assert main(["bench", "--models", path, "--ratios", "1:1", "--strategies", "static,sync",
                 "--device", "cpu", "--no-progress", "-o", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["model", "ratio", "strategy", "solver", "status"]
    assert [line.split()[2] for line in lines[1:3]] == ["static", "sync"]
    assert " ms " in lines[1] and "x" in lines[1]


def test_zoo_export_without_weights_says_other_tools_cannot_open_it(tmp_path, capsys):
    assert main(["zoo", "export", "dlrm", "--batch", "2", "-o", str(tmp_path / "d.onnx")]) == 0
    out = capsys.readouterr().out
    assert "onnx.load, onnxruntime and Netron cannot open it without d.weights.bin" in out
    assert main(["zoo", "export", "dlrm", "-o", str(tmp_path / "e.onnx"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["loadable_by_other_tools"] is False


def test_summary_formats_the_gap_and_every_first_reader(net, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main(["optimize", "net", "--fast-mem", "900KiB", "-o", str(plan),
                 "--no-baselines"]) == 0
    assert main(["report", str(plan), "-o", str(tmp_path / "r"), "--format", "svg"]) == 0
    text = (tmp_path / "r" / "summary.md").read_text()
    solver = next(line for line in text.splitlines() if line.startswith("| solver"))
    assert "gap -" in solver or "%" in solver.split("gap ")[1].split(",")[0]
    rows = [line for line in text.splitlines() if line.startswith("| ") and "→" in line]
    assert rows and all(not line.rstrip().endswith("|  |") for line in rows)
