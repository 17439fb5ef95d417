"""The figure scripts and notebooks run on small synthetic results made here (test data only:
never written into experiments/results)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotm_py.bench import COLUMNS, write_results

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"
sys.path.insert(0, str(EXPERIMENTS))

import figlib  # noqa: E402
import figures  # noqa: E402


def _row(model, ratio, strategy, **values):
    fast, slow = (float(x) for x in ratio.split(":"))
    share = fast / (fast + slow)
    row = dict.fromkeys(COLUMNS)
    row.update(model=model, batch=8, training=True, device="cpu", memory="optane", ratio=ratio,
               strategy=strategy, solver="cbc", status="optimal", variables=1000 * (1 + len(
                   strategy)), constraints=500, build_s=0.1, solve_s=0.5,
               budget_bytes=int(4e9 * share), peak_bytes=int(4e9), all_fast_s=1.0,
               all_slow_s=3.0, first_touch_s=2.5 - share, predicted_s=1.0 + (1 - share),
               bytes_to_fast=int(1e9 * (1 - share)), bytes_to_slow=int(5e8 * (1 - share)),
               input_fast_fraction=share, output_fast_fraction=min(1.0, share + 0.2))
    row.update(values)
    return row


def synthetic_results(folder: Path) -> None:
    host = [_row(m, r, s) for m in ("vgg19", "resnet200") for r in ("1:8", "1:4", "1:1")
            for s in ("static", "sync")]
    sweep = [_row("inception_v4", f"1:{k}", s) for k in (1, 2, 3, 5, 8) for s in
             ("static", "sync")]
    gpu = [_row("resnet50", "1:2", s, device="cuda", memory="h100-pcie5", measured_s=1.1,
                measured_lru_s=2.0, measured_offload_s=1.6, lru_s=1.9, offload_s=1.5,
                oracle_s=0.9, device_name="NVIDIA H100 80GB HBM3")
           for s in ("sync", "async")]
    for name, rows in (("host_conventional", host), ("host_inception_sweep", sweep),
                       ("gpu_test", gpu)):
        write_results(rows, folder / f"{name}.csv", folder / f"{name}.json")


def test_every_figure_from_synthetic_results(tmp_path):
    synthetic_results(tmp_path / "results")
    written, skipped = figures.make_all(tmp_path / "results", tmp_path / "figs")
    assert skipped == []
    stems = sorted({p.stem for p in written})
    assert stems == ["fig07_speedup", "fig09_cost", "fig10_inception_sweep", "fig11_error",
                     "fig12_gpu", "fig_ilp_times"]
    assert all(p.stat().st_size > 1000 for p in written)
    assert {p.suffix for p in written} == {".png", ".svg"}


def test_missing_results_are_skipped_with_the_command(tmp_path):
    written, skipped = figures.make_all(tmp_path / "none", tmp_path / "figs")
    assert written == [] and len(skipped) == 6
    assert any("run_experiments.py gpu" in line for line in skipped)


def test_figure_numbers():
    import fig07_speedup
    import fig09_cost
    import fig11_error

    rows = [_row("m", r, s) for r in ("1:8", "1:4", "1:1") for s in ("static", "sync")]
    sp = fig07_speedup.speedups(rows, "m")
    assert sp["sync"][2] == pytest.approx(3.0 / 1.5)  # 1:1: predicted 1.5, all slow 3.0
    assert sp["first_touch"][0] == pytest.approx(3.0 / (2.5 - 1 / 9))
    assert fig09_cost.relative_cost("1:1") == pytest.approx((1 + 1 / 2.1) / 2)
    assert fig09_cost.relative_cost("0:1") == pytest.approx(1 / 2.1)
    gpu = [_row("m", "1:2", "sync", predicted_s=1.2, measured_s=1.0)]
    labels, err = fig11_error.errors(gpu)
    assert err["sync"] == [pytest.approx(20.0)] and len(labels) == 1
    assert figlib.paper_ratio("1:4") == "4:1"


def test_figures_script_runs(tmp_path):
    synthetic_results(tmp_path / "r")
    out = subprocess.run([sys.executable, str(EXPERIMENTS / "figures.py"), "--results",
                          str(tmp_path / "r"), "--figures", str(tmp_path / "f")],
                         capture_output=True, text=True, check=True)
    assert out.stdout.count("wrote ") == 12


def _execute_notebook(name: str, env: dict[str, str]) -> None:
    import jupytext
    from nbclient import NotebookClient

    nb = jupytext.read(EXPERIMENTS / "notebooks" / f"{name}.py")
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        NotebookClient(nb, timeout=120, kernel_name="python3",
                       resources={"metadata": {"path": str(EXPERIMENTS / "notebooks")}}).execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors


def test_notebooks_execute(tmp_path):
    from tests.test_report_support import simulation_dict, skip_graph, skip_plan

    synthetic_results(tmp_path / "r")
    _execute_notebook("paper_figures", {"AUTOTM_RESULTS": str(tmp_path / "r"),
                                        "AUTOTM_FIGURES": str(tmp_path / "f")})
    assert len(list((tmp_path / "f").glob("*.svg"))) == 6
    skip_plan(skip_graph()).save(tmp_path / "plan.json")
    (tmp_path / "sim.json").write_text(__import__("json").dumps(simulation_dict()))
    _execute_notebook("plan_report", {"AUTOTM_PLAN": str(tmp_path / "plan.json"),
                                      "AUTOTM_TIMELINE": str(tmp_path / "sim.json")})


def test_timeline_gaps_accounts_for_a_plans_iteration(tmp_path):
    """experiments/timeline_gaps.py on the timeline of a plan that moves tensors: the GPU's
    kernel time and its waits add up to the iteration, and the link's copies are listed per
    direction; a file that is not a timeline is a one-line error."""
    import json

    import timeline_gaps

    from autotm_py import pipeline
    from autotm_py.config import PlanConfig
    from autotm_py.options import RunMode
    from tests.graphs import costs_for, layered_net

    graph = layered_net(6, width=4, kib=256)
    costs = costs_for(graph, "cuda")
    config = PlanConfig(ratio="1:3", device="cuda", strategy="async", time_limit_s=30,
                        run=RunMode())  # eager on torch's allocator: no arena to pack
    plan = pipeline.optimize(graph, config, costs=costs).plan
    timeline = pipeline.simulate(graph, plan, costs=costs).to_dict()
    spans = timeline_gaps.gpu_spans(timeline)
    idle = sum(g for g, _, _ in timeline_gaps.waits(spans))
    busy = sum(end - start for start, end, _ in spans)
    assert busy + idle == pytest.approx(max(end for _, end, _ in spans), rel=1e-6)
    assert timeline_gaps.link_busy(timeline), "the plan at a quarter of the peak moves"
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(timeline))
    done = subprocess.run([sys.executable, str(EXPERIMENTS / "timeline_gaps.py"), str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("iteration "), done.stderr
    path.write_text("not json")
    done = subprocess.run([sys.executable, str(EXPERIMENTS / "timeline_gaps.py"), str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "give the JSON `autotm simulate -o` writes" in done.stderr
