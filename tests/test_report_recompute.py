"""Reports of plans that recompute: regenerated tensors and re-runs have their own colour in the
residency plot, bands in the memory plot, slices and flows in the trace, and lines in the
summary."""

import json

import numpy as np
import pytest

from autotm_py.costs import KernelCosts
from autotm_py.memory.tiers import preset
from autotm_py.pipeline import simulate
from autotm_py.plan import Compute, Free, Plan, PlanHeader, Recompute, names_table
from autotm_py.report.build import make_report, timelines
from autotm_py.report.plots import RECOMPUTE_COLOUR, _colour_index, plot_memory, plot_residency
from autotm_py.report.residency import FAST_BIT, REGEN_BIT, PlanView, walk
from autotm_py.report.trace import COMPUTE_TID, RECOMPUTE_NAME, chrome_trace
from tests.test_report_support import KIB, skip_graph
from tests.test_trace import check_trace

MS = 1e-3


def recompute_plan(graph):
    """skip_graph: `a` is dropped after k1 with no copy anywhere and regenerated before k3 by
    re-running k0 (which needs x, kept until then)."""
    x, a, b, c, _d = range(5)
    records = (
        Compute(0, ("fast", "fast")), Compute(1, ("fast", "fast")), Free(a, "fast"),
        Compute(2, ("fast", "fast")), Free(b, "fast"),
        Recompute(0, (a,), 3), Free(x, "fast"),
        Compute(3, ("fast", "fast", "fast")), Free(a, "fast"), Free(c, "fast"),
    )
    budget = 8 * KIB
    header = PlanHeader(model_hash=graph.model_hash, model_name=graph.name,
                        strategy="sync+recompute", budget_bytes=budget,
                        memory_system=preset("h100-pcie5").with_budget(budget).to_dict(),
                        predicted_time_s=5 * MS, device="cuda",
                        counts={"recomputes": 1, "recompute_s": MS})
    return Plan(header, {x: ("fast",)}, records, names_table(graph))


def simulation(graph, plan):
    costs = KernelCosts.from_times("cuda", [MS] * len(graph.kernels))
    return simulate(graph, plan, costs=costs).to_dict()


def test_the_walk_marks_regenerated_copies():
    graph = skip_graph()
    res = walk(recompute_plan(graph), PlanView.from_graph(graph))
    (r,) = res.recomputes
    assert (r.kernel, r.before, r.outputs, r.position, r.nbytes) == (0, 3, (1,), 3, 2 * KIB)
    assert res.regenerated_tensors() == {1}
    masks = res.state_matrix([1])[0].tolist()  # a: fast, fast, absent, fast (regenerated)
    assert masks == [FAST_BIT, FAST_BIT, 0, FAST_BIT | REGEN_BIT]
    assert _colour_index(np.array(masks)).tolist() == [1, 1, 0, 4]


def test_timelines_carry_the_reruns():
    graph = skip_graph()
    plan = recompute_plan(graph)
    _, _, steps, _ = timelines(plan)
    (span,) = steps.recomputes
    assert (span.kernel, span.start, span.end, steps.total) == (0, 3.0, 4.0, 5.0)
    assert [k.start for k in steps.kernels] == [0, 1, 2, 4]  # the re-run takes a step
    _, _, sim, _ = timelines(plan, simulation=simulation(graph, plan))
    (span,) = sim.recomputes
    assert (span.start, span.end) == pytest.approx((3 * MS, 4 * MS)) and span.outputs == (1,)
    run = {"iteration_times_s": [6 * MS], "median_s": 6 * MS,
           "kernel_times_s": [1.5 * MS, MS, MS, MS]}
    _, _, _, measured = timelines(plan, measured=run)
    (span,) = measured.recomputes  # drawn with its kernel's measured time
    assert (span.start, span.end) == pytest.approx((3.5 * MS, 5 * MS))
    assert measured.total == pytest.approx(6 * MS)


def test_trace_shows_reruns_in_their_own_colour_with_a_flow_to_the_reader():
    graph = skip_graph()
    plan = recompute_plan(graph)
    view, _, tl, _ = timelines(plan, simulation=simulation(graph, plan))
    ph = check_trace(json.loads(json.dumps(chrome_trace(view, tl))))
    (rerun,) = [e for e in ph["X"] if e["cat"] == "recompute"]
    assert (rerun["name"], rerun["tid"], rerun["cname"]) == (RECOMPUTE_NAME, COMPUTE_TID,
                                                             "yellow")
    assert rerun["args"]["regenerates"] == ["a"] and rerun["args"]["kernel_name"] == "k0"
    assert rerun["ts"] == pytest.approx(3000.0) and rerun["dur"] == pytest.approx(1000.0)
    flows = [e for e in ph["s"] + ph["f"] if e["name"] == "regenerate"]
    assert len(flows) == 2
    reader = next(e for e in ph["X"] if e["cat"] == "kernel" and e["args"]["kernel"] == 3)
    assert next(e for e in flows if e["ph"] == "f")["ts"] == pytest.approx(reader["ts"])
    names = [e["args"]["name"] for e in ph["M"] if e["name"] == "thread_name"]
    assert "compute (kernels and re-runs)" in names


def test_plots_draw_regenerated_cells_and_rerun_bands():
    from matplotlib.colors import to_rgba

    graph = skip_graph()
    plan = recompute_plan(graph)
    view, res, tl, _ = timelines(plan, simulation=simulation(graph, plan))
    fig = plot_residency(view, res)
    (image,) = fig.axes[0].get_images()
    assert to_rgba(RECOMPUTE_COLOUR) in [to_rgba(c) for c in image.cmap.colors]
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "fast, regenerated (re-run)" in labels and "re-run of its producer" in labels
    fig = plot_memory(tl)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(label.startswith("re-runs (recompute): 1, 1 ms") for label in labels), labels


def test_report_summary_counts_reruns(tmp_path):
    graph = skip_graph()
    plan = recompute_plan(graph)
    result = make_report(plan, tmp_path, simulation=simulation(graph, plan), formats=("png",),
                         trace_path=tmp_path / "trace.json")
    text = (tmp_path / "summary.md").read_text()
    assert "1 re-runs of forward kernels regenerate 2.00 KiB" in text
    assert result.metrics["recomputes"] == 1 and result.metrics["recomputed_bytes"] == 2 * KIB
    assert result.overview["recompute_s"] == pytest.approx(MS)
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert any(e.get("cat") == "recompute" for e in trace["traceEvents"])
