"""`autotm report` end to end: a plan from the real planner, its simulation, a real CPU run."""

import json

import pytest

from autotm_py import api
from autotm_py.cli import main
from autotm_py.config import PlanConfig
from autotm_py.units import parse_ratio
from tests.test_report_support import tiny_onnx
from tests.test_trace import check_trace


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """(onnx path, plan path, simulation path, measured run path) of a GPU-mode sync plan."""
    d = tmp_path_factory.mktemp("planned")
    onnx_path = tiny_onnx(d / "tiny.onnx", hidden=128, layers=3)
    graph = api.load_model(onnx_path, training=True)
    result = api.optimize(graph, PlanConfig(strategy="sync", ratio=parse_ratio("1:1"),
                                            device="cuda"))
    assert result.plan is not None and any(True for _ in result.plan.moves())
    result.plan.save(d / "plan.json")
    sim = api.simulate(graph, result.plan)
    (d / "sim.json").write_text(json.dumps(sim.to_dict()))
    run = api.execute(graph, result.plan, device="cpu", iterations=2, warmup=1)
    (d / "run.json").write_text(json.dumps(run.to_dict()))
    return onnx_path, d / "plan.json", d / "sim.json", d / "run.json", sim


def test_report_with_model_resimulates(planned, tmp_path, capsys):
    onnx_path, plan, _, run, sim = planned
    code = main(["report", str(plan), "--model", onnx_path, "--training", "-o",
                 str(tmp_path / "r"), "--measured", str(run), "--trace", str(tmp_path / "t.json")])
    assert code == 0
    out = capsys.readouterr().out
    assert "timeline simulated" in out and "wrote" in out
    summary = (tmp_path / "r" / "summary.md").read_text()
    assert "| timeline | simulated |" in summary and "measured iteration (median)" in summary
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    assert doc["overview"]["peak_fast_bytes"] == sim.fast_peak_bytes
    assert doc["overview"]["timeline_total_s"] == pytest.approx(sim.total_s)
    ph = check_trace(json.loads((tmp_path / "t.json").read_text()))
    assert len(ph["s"]) >= 1  # prefetches point at their readers
    kernels = [e for e in ph["X"] if e["pid"] == 1 and e["cat"] == "kernel"]
    assert len(kernels) == len(sim.kernels)


def test_report_from_saved_timeline_matches(planned, tmp_path, capsys):
    _, plan, timeline, _, sim = planned
    assert main(["report", str(plan), "--timeline", str(timeline), "-o", str(tmp_path),
                 "--json", "--format", "svg"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["overview"]["timeline"] == "simulated"
    assert doc["metrics"]["bytes_to_fast"] == sum(
        m.bytes for m in sim.moves if m.to == "fast")
    assert sorted(p.name for p in tmp_path.glob("*.svg")) == ["memory.svg", "moves.svg",
                                                             "residency.svg"]


def test_report_plan_alone_is_plan_order(planned, tmp_path, capsys):
    _, plan, _, _, _ = planned
    assert main(["report", str(plan), "-o", str(tmp_path)]) == 0
    assert "timeline plan-order" in capsys.readouterr().out
    assert (tmp_path / "residency.png").exists()


@pytest.mark.parametrize("extra, message", [
    (["--format", "png,nope"], "unknown figure format nope"),
    (["--timeline", "T", "--model", "m"], "give one of --timeline, --model and --simulate"),
    (["--timeline", "PLAN"], "not a simulation result"),
    (["--measured", "PLAN"], "not a measured run"),
])
def test_report_errors_are_one_line_and_write_nothing(planned, tmp_path, capsys, extra, message):
    _, plan, _, _, _ = planned
    extra = [str(plan) if x == "PLAN" else x for x in extra]
    code = main(["report", str(plan), "-o", str(tmp_path / "out"), *extra])
    err = capsys.readouterr().err
    assert code != 0 and err.startswith("error: ") and message in err
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()


def test_missing_plan_file(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope.json")]) == 1
    assert "cannot read plan" in capsys.readouterr().err


def test_timeline_of_another_plan_is_refused(planned, tmp_path, capsys):
    _, plan, timeline, _, _ = planned
    doc = json.loads(timeline.read_text())
    doc["kernels"] = doc["kernels"][:-1]
    (tmp_path / "other.json").write_text(json.dumps(doc))
    assert main(["report", str(plan), "--timeline", str(tmp_path / "other.json"), "-o",
                 str(tmp_path / "r")]) == 1
    assert "simulate this plan" in capsys.readouterr().err
