import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from autotm_py.errors import PlanError
from autotm_py.plan import Compute, Plan
from autotm_py.report.build import make_report, timelines
from autotm_py.report.metrics import plan_metrics
from autotm_py.report.residency import PlanView, walk
from tests.test_report_support import KIB, simulation_dict, skip_graph, skip_plan

RUN = {"iteration_times_s": [5e-3, 5.2e-3, 5.1e-3], "median_s": 5.1e-3,
       "kernel_times_s": [1e-3, 1e-3, 1.2e-3, 1e-3], "peak_fast_bytes": 7000,
       "budget_bytes": 6 * KIB}


def test_walk_tracks_bytes_per_tier_and_residency():
    plan = skip_plan(skip_graph())
    res = walk(plan, PlanView.from_plan(plan))
    assert res.order == (0, 1, 2, 3)
    # x=1K a=2K b=1K c=2K d=2K: evict a after k0, prefetch it before k2
    assert (res.fast_bytes // KIB).tolist() == [3, 2, 2, 3, 1, 3, 5, 4, 6, 4, 4, 2]
    assert (res.slow_bytes // KIB).tolist() == [0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0]
    assert res.peak_fast_bytes == 6 * KIB
    grid = res.state_matrix([0, 1, 2, 3, 4])
    # 1 fast, 2 slow, 3 both: `a` keeps its fast copy during k1 (freed after it)
    assert grid.tolist() == [[1, 0, 0, 0], [1, 3, 3, 3], [0, 1, 1, 0], [0, 0, 1, 1],
                             [0, 0, 0, 1]]
    evict, prefetch = res.moves
    assert (evict.to, evict.position, evict.consumer) == ("slow", 1, None)
    assert (prefetch.to, prefetch.position, prefetch.consumer) == ("fast", 2, 3)


def test_view_from_plan_equals_view_from_graph():
    graph = skip_graph()
    plan = skip_plan(graph)
    assert PlanView.from_plan(plan) == PlanView.from_graph(graph)


def test_plan_without_io_table_needs_the_model():
    plan = skip_plan(skip_graph())
    old = Plan(plan.header, plan.initial, plan.records,
               {k: v for k, v in plan.names.items() if k != "kernel_io"})
    with pytest.raises(PlanError, match="--model"):
        PlanView.from_plan(old)
    assert PlanView.from_plan(old, skip_graph()).kernel_io[3] == ((1, 3), (4,))


def test_plan_order_timeline_steps():
    graph = skip_graph()
    _, _, tl, _ = timelines(skip_plan(graph, mode="async"))
    assert tl.unit == "step" and tl.total == 4.0
    assert [(k.start, k.end) for k in tl.kernels] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    # an async copy spans the kernel it overlaps
    assert [(m.to, m.start, m.end) for m in tl.moves] == [("slow", 1, 2), ("fast", 2, 3)]
    _, _, sync, _ = timelines(skip_plan(graph, mode="sync"))
    # a sync copy takes its own step, and compute waits for it
    assert sync.total == 6.0
    assert [(m.start, m.end) for m in sync.moves] == [(1, 2), (3, 4)]
    assert [k.start for k in sync.kernels] == [0, 2, 4, 5]
    assert np.all(np.diff(sync.memory_t) > 0)  # one point per instant


def test_measured_timeline_lays_kernels_end_to_end():
    plan = skip_plan(skip_graph())
    _, _, _, tl = timelines(plan, measured=RUN)
    assert [round(k.end, 6) for k in tl.kernels] == [1e-3, 2e-3, 3.2e-3, 4.2e-3]
    assert tl.measured_peak_fast_bytes == 7000 and tl.iteration_times_s == tuple(
        RUN["iteration_times_s"])
    with pytest.raises(PlanError, match="kernel_times_s"):
        timelines(plan, measured={**RUN, "kernel_times_s": [1e-3, None, 1e-3, 1e-3]})
    _, _, _, bare = timelines(plan, measured={**RUN, "kernel_times_s": None})
    assert bare.kernels == () and bare.total == RUN["median_s"]


def test_simulated_timeline_reads_simulation_dict():
    _, _, tl, _ = timelines(skip_plan(skip_graph()), simulation=simulation_dict())
    assert tl.source == "simulated" and tl.unit == "s"
    assert tl.total == pytest.approx(4.5e-3)
    assert tl.moves[1].consumer == 3 and tl.moves[1].nbytes == 2 * KIB
    assert tl.peak_fast_bytes == 5 * KIB


def test_metrics_bytes_moved_and_io_share():
    graph = skip_graph()
    plan = skip_plan(graph)
    m = plan_metrics(plan, PlanView.from_graph(graph))
    assert (m.bytes_to_fast, m.bytes_to_slow) == (2 * KIB, 2 * KIB)
    assert (m.async_bytes_to_fast, m.sync_bytes_to_fast) == (2 * KIB, 0)
    assert m.input_fast_fraction == 1.0 and m.input_bytes == 8 * KIB
    # host mode: k3 reads `a` (2K of its 4K inputs) from the slow tier
    records = tuple(Compute(3, ("slow", "fast", "fast")) if isinstance(r, Compute)
                    and r.kernel == 3 else r for r in plan.records)
    m2 = plan_metrics(replace(plan, records=records), PlanView.from_graph(graph))
    assert m2.input_fast_fraction == pytest.approx(6 / 8)
    assert m2.output_fast_fraction == 1.0


def test_make_report_writes_figures_summary_and_json(tmp_path):
    plan = skip_plan(skip_graph())
    result = make_report(plan, tmp_path / "out", simulation=simulation_dict(), measured=RUN,
                         trace_path=tmp_path / "trace.json")
    names = sorted(p.name for p in result.files)
    assert names == sorted(["memory.png", "memory.svg", "residency.png", "residency.svg",
                            "moves.png", "moves.svg", "summary.md", "report.json",
                            "trace.json"])
    out = tmp_path / "out"
    assert (out / "memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = (out / "residency.svg").read_text()
    assert "<svg" in svg and "prefetch" in svg  # legend text is kept as text
    text = (out / "summary.md").read_text()
    assert "| fast budget | 6.00 KiB" in text
    assert "waits on copies" in text and "| a | 2.00 KiB | → fast | async | k2 | k3 |" in text
    doc = json.loads((out / "report.json").read_text())
    assert doc["overview"]["prediction_error"] == pytest.approx((1e-3 - 5.1e-3) / 5.1e-3)
    assert doc["metrics"]["bytes_to_fast"] == 2 * KIB


def test_report_modules_import_matplotlib_lazily():
    code = ("import sys, autotm_py.report.build, autotm_py.report.plots, "
            "autotm_py.report.trace, autotm_py.report.summary; "
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_simulation_violations_reach_the_summary(tmp_path):
    sim = {**simulation_dict(), "violations": ["record #8 compute 'k3': over the budget"]}
    make_report(skip_plan(skip_graph()), tmp_path, simulation=sim, formats=("png",))
    text = (tmp_path / "summary.md").read_text()
    assert "1 rule violation(s); the first: record #8 compute 'k3'" in text
