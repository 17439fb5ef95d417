"""`autotm inspect`: the summary, --json, --csv, --training, zoo names."""

from __future__ import annotations

import csv
import json

import onnx
import pytest

from autotm_py import api
from autotm_py.cli import main
from autotm_py.cli.inspect import inspect_report
from autotm_py.config import PlanConfig
from autotm_py.machine import working_sets
from tests.fixtures import onnx_models as M


@pytest.fixture(scope="module")
def zoo9(tmp_path_factory):
    path = tmp_path_factory.mktemp("inspect") / "zoo9.onnx"
    onnx.save(M.opset9_zoo(), path)
    return path


def test_text_summary(zoo9, capsys):
    assert main(["inspect", str(zoo9), "--batch", "4", "--precision", "fp32"]) == 0
    out = capsys.readouterr().out
    g = api.load_model(zoo9, batch=4)
    assert f"kernels      {len(g.kernels)} ({g.unique_signatures} unique signatures)" in out
    for role in ("activation", "input", "output", "weight"):
        assert role in out
    peak = g.kernels[g.peak_kernel]
    assert f"at kernel #{peak.id} {peak.name} ({peak.op_type})" in out
    _ws_bytes, ws_kernel = g.max_working_set
    assert f"#{ws_kernel} {g.kernels[ws_kernel].name}" in out
    assert "useful fast-memory budgets" in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_json_matches_the_graph(zoo9, capsys):
    assert main(["inspect", str(zoo9), "--json", "--precision", "fp32"]) == 0
    data = json.loads(capsys.readouterr().out)
    g = api.load_model(zoo9)
    assert data["kernels"] == len(g.kernels) and data["unique_kernels"] == g.unique_signatures
    assert data["peak_live_bytes"] == g.peak_live_bytes
    assert data["peak_kernel"]["id"] == g.peak_kernel
    ws = working_sets(g, api.load_costs(g, device="cuda"))
    # the planner's useful budgets (sizes aligned) for the default run mode, and without an
    # arena (no scratch region beside the tensors) the largest working set to the peak
    least = data["smallest_budget"]
    assert data["budget_interval_bytes"][0] == least["budget_bytes"] >= int(ws.max())
    assert main(["inspect", str(zoo9), "--json", "--no-arena", "--precision", "fp32"]) == 0
    plain = json.loads(capsys.readouterr().out)
    lo, hi = plain["budget_interval_bytes"]
    assert lo == int(ws.max()) and g.peak_live_bytes <= hi < g.peak_live_bytes + 512 * 32
    assert data["roles"]["weight"]["bytes"] == sum(t.nbytes for t in g.tensors
                                                   if t.role.value == "weight")
    rows = data["per_kernel"]
    assert [r["working_set_bytes"] for r in rows] == ws.tolist()
    assert [r["live_bytes"] for r in rows] == g.live_bytes.tolist()
    assert all(r["working_set_bytes"] <= r["live_bytes"] for r in rows)


def test_csv_has_one_row_per_kernel(zoo9, tmp_path, capsys):
    target = tmp_path / "out" / "kernels.csv"
    assert main(["inspect", str(zoo9), "--csv", str(target), "--precision", "fp32"]) == 0
    assert str(target) in capsys.readouterr().out
    with target.open() as fh:
        rows = list(csv.DictReader(fh))
    g = api.load_model(zoo9)
    assert [int(r["id"]) for r in rows] == list(range(len(g.kernels)))
    assert [r["op"] for r in rows] == [k.op_type for k in g.kernels]
    assert [int(r["live_bytes"]) for r in rows] == g.live_bytes.tolist()
    assert not list(target.parent.glob(".*tmp"))  # written atomically, no leftovers


def test_training_iteration(zoo9, capsys):
    assert main(["inspect", str(zoo9), "--training", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    forward = inspect_report(api.load_model(zoo9))
    assert data["training"] and not forward["training"]
    assert data["kernels"] > 2 * forward["kernels"]
    assert "gradient" in data["roles"] and data["peak_live_bytes"] > forward["peak_live_bytes"]


def test_zoo_model_by_name(capsys):
    assert main(["inspect", "resnet50", "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "model        resnet50 (forward)" in out and "batch=2" in out


def test_bad_csv_path_is_clean(zoo9, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code = main(["inspect", str(zoo9), "--csv", str(blocker / "sub" / "k.csv")])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err


def test_the_smallest_useful_budget_is_the_planners_smallest_feasible_one(capsys):
    """inspect counts the profiled kernel workspaces as the planner does: ResNet-50 b8's
    combined convolution backward needs a 39 MiB cuDNN workspace on the H100, more than any
    working set of the IR alone, and a budget just under inspect's lower end is infeasible
    with exactly that end as the smallest feasible budget."""
    args = ["resnet50", "--batch", "8", "--training", "--precision", "fp32"]
    assert main(["inspect", *args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    lo = data["budget_interval_bytes"][0]
    graph = api.load_model("resnet50", batch=8, training=True)
    # the measured workspace counts
    assert lo - data["runtime_reserve_bytes"] > graph.max_working_set[0]
    result = api.optimize(graph, PlanConfig(fast_mem_bytes=lo - 1))
    assert result.status == "infeasible" and result.min_feasible_budget_bytes == lo
