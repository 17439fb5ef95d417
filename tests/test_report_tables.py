import csv
import io

import pytest

from autotm_py.costs import KernelCosts
from autotm_py.ir import GraphBuilder, Role
from autotm_py.report.tables import (
    describe_signature,
    kernel_csv,
    kernel_report,
    render_kernel_report,
)
from tests.synthetic import chain


def repeated_graph():
    """Three identical 4 KiB Relu blocks and one big 8 KiB Add (different signature)."""
    g = GraphBuilder("rep")
    x = g.add_tensor("x", (1024,), "float32", Role.INPUT)
    prev = x
    for i in range(3):
        out = g.add_tensor(f"r{i}", (1024,), "float32", Role.ACTIVATION)
        g.add_kernel("Relu", [prev], [out], name=f"relu{i}")
        prev = out
    y = g.add_tensor("y", (1024,), "float32", Role.OUTPUT)
    g.add_kernel("Add", [x, prev], [y], name="add")
    g.inputs.append(x)
    g.outputs.append(y)
    return g.build()


def test_kernel_report_bounds_and_rows():
    graph = repeated_graph()
    rep = kernel_report(graph)
    assert rep["sweep_bytes"] == [graph.max_working_set[0], graph.peak_live_bytes]
    assert rep["max_working_set_bytes"] == 12 * 1024  # add: x, r2, y
    # x lives until `add`, so relu1 has x, r0 (input) and r1 (output) live
    row = rep["per_kernel"][1]
    assert (row["working_set_bytes"], row["live_bytes"]) == (8 * 1024, 12 * 1024)
    assert row["working_share"] == pytest.approx(2 / 3)
    assert row["time_s"] is None


def test_signatures_ranked_by_time_share():
    graph = repeated_graph()
    costs = KernelCosts.from_times("cpu", [1e-3, 1e-3, 1e-3, 5e-3])
    sigs = kernel_report(graph, costs)["signatures"]
    assert [(s["op"], s["count"]) for s in sigs] == [("Add", 1), ("Relu", 3)]
    assert sigs[0]["time_share"] == pytest.approx(5 / 8)
    assert sigs[1]["time_share"] == pytest.approx(3 / 8)
    assert sigs[1]["signature"] == "Relu 1024 -> 1024"
    # without costs, the most repeated signature comes first
    assert kernel_report(graph)["signatures"][0]["count"] == 3


def test_render_and_csv():
    graph = chain(4, size=256)
    rep = kernel_report(graph, KernelCosts.from_times("cpu", [1e-3] * 4))
    text = render_kernel_report(rep, limit=2)
    assert "largest working set 2.00 KiB" in text and "useful budget sweep" in text
    assert "100.0% of time" in text
    rows = list(csv.DictReader(io.StringIO(kernel_csv(rep))))
    assert len(rows) == 4 and rows[0]["working_set_bytes"] == "2048"


def test_describe_signature_falls_back_on_plain_text():
    assert describe_signature("not json") == "not json"


def test_inspect_kernels_cli(tmp_path, capsys):
    import json

    from autotm_py.cli import main
    from tests.test_report_support import tiny_onnx

    model = tiny_onnx(tmp_path / "m.onnx", hidden=64, layers=2)
    assert main(["inspect", model, "--kernels", "cpu", "--csv", str(tmp_path / "k.csv")]) == 0
    out = capsys.readouterr().out
    assert "useful budget sweep" in out and "most repeated signatures by time" in out
    assert (tmp_path / "k.csv").read_text().startswith("id,name,op,working_set_bytes")
    # flag alone: cuda profiles (fp32: in bf16, the GPU default, the casts add kernels)
    assert main(["inspect", model, "--kernels", "--json", "--precision", "fp32"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kernels"] == 4 and doc["sweep_bytes"][0] <= doc["sweep_bytes"][1]
    assert abs(sum(s["time_share"] for s in doc["signatures"]) - 1.0) < 1e-9
