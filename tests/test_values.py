"""Value profiling (`autotm profile --values`) and the planner's use of its facts: a tensor
found all zero or one constant is dropped for free and filled again instead of copied
(docs/values.md). The graph is built here with the IR builder: a zero additive mask and a
constant scale read at the start and again at the end of a chain, under a budget that cannot
keep them in fast memory in between."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from autotm_py import api  # noqa: E402
from autotm_py.cli import main  # noqa: E402
from autotm_py.config import PlanConfig  # noqa: E402
from autotm_py.costs import KernelCosts  # noqa: E402
from autotm_py.ir import GraphBuilder, Role  # noqa: E402
from autotm_py.options import RunMode  # noqa: E402
from autotm_py.pipeline import machine_for  # noqa: E402
from autotm_py.plan import Fill, Move, Plan  # noqa: E402
from autotm_py.planning.recompute import fill_candidates  # noqa: E402
from autotm_py.runtime.execute import run_steps  # noqa: E402

KIB = 1024
SIZE_KIB = 256
FACTS = (("mask", 0.0), ("scale", 2.0))


def value_graph(kib: int = SIZE_KIB) -> object:
    """x + mask -> relu -> * scale -> relu x3 -> + mask -> * pattern * scale (inference)."""
    b = GraphBuilder("values")
    n = kib * KIB // 4
    x = b.add_tensor("x", (n,), "float32", Role.INPUT)
    b.inputs.append(x)
    mask = b.add_constant("mask", np.zeros((n,), dtype=np.float32))
    scale = b.add_constant("scale", np.full((n,), 2.0, dtype=np.float32))
    pattern = b.add_constant("pattern", np.arange(16, dtype=np.float32) % 2)
    h = [b.add_tensor(f"h{i}", (n,), "float32", Role.ACTIVATION) for i in range(8)]
    small = b.add_tensor("small", (16,), "float32", Role.ACTIVATION)
    b.add_kernel("Add", [x, mask], [h[0]])
    b.add_kernel("Relu", [h[0]], [h[1]])
    b.add_kernel("Mul", [h[1], scale], [h[2]])
    for i in (3, 4, 5):
        b.add_kernel("Relu", [h[i - 1]], [h[i]])
    b.add_kernel("Add", [h[5], mask], [h[6]])
    b.add_kernel("Mul", [h[6], scale], [h[7]])
    b.add_kernel("Mul", [pattern, pattern], [small])
    b.outputs += [h[7], small]
    return b.build()


def tid_of(graph, name: str) -> int:
    return graph.tensor_ids_by_name[name]


def costs_of(graph) -> KernelCosts:
    return KernelCosts.from_times("cuda", [1e-4] * len(graph.kernels))


def config(fills=(), **kw) -> PlanConfig:
    """GPU mode, room for three of the chain's tensors: the mask and the scale cannot stay."""
    base = dict(fast_mem_bytes=3 * SIZE_KIB * KIB + 64 * KIB, reserve_bytes=0,
                run=RunMode(), time_limit_s=60, fills=fills)
    return PlanConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def graph():
    return value_graph()


@pytest.fixture(scope="module")
def profile(graph):
    return api.profile_values(graph, device="cpu", iterations=2)


def test_profile_finds_the_zero_and_the_constant_tensor(graph, profile):
    rows = {r["name"]: r for r in profile["tensors"]}
    assert rows["mask"]["class"] == "zero" and rows["mask"]["value"] == 0.0
    assert rows["scale"]["class"] == "constant" and rows["scale"]["value"] == 2.0
    assert rows["pattern"]["class"] == "low-entropy"
    assert sorted(v for v, _ in rows["pattern"]["histogram"]) == [0.0, 1.0]
    assert rows["x"]["class"] == "varied" and rows["h3"]["class"] == "varied"
    # the same seeded inputs each iteration: every tensor of an inference graph repeats
    assert all(r["unchanged"] for r in profile["tensors"])
    assert rows["mask"]["bytes"] == SIZE_KIB * KIB and rows["mask"]["copy_s"] > 0
    assert profile["totals"]["zero"]["bytes"] == SIZE_KIB * KIB
    assert "random" in profile["note"]
    assert api.value_fills(profile) == FACTS


def test_a_graph_input_is_not_taken_for_a_constant_when_it_varies(graph):
    """Two seeds give two different inputs: the profile of each still calls x varied, and
    a value is only a fact where it was the same in every iteration."""
    from autotm_py.profiling.values import Seen, observe, verdict

    seen = Seen()
    observe(seen, torch.zeros(8))
    observe(seen, torch.full((8,), 3.0))
    assert verdict(seen) == "low-entropy"  # zero once, 3 once: no one value to fill with
    assert not seen.repeats


def _plans(graph, **kw):
    costs = costs_of(graph)
    return [api.optimize(graph, config(fills, **kw), costs=costs) for fills in ((), FACTS)]


@pytest.mark.parametrize("strategy", ["sync", "async"])
def test_the_planner_fills_known_values_instead_of_copying_them(graph, strategy):
    without, with_facts = _plans(graph, strategy=strategy)
    assert without.status == with_facts.status == "optimal"
    ids = {tid_of(graph, name) for name, _ in FACTS}
    moved = {r.tensor for r in without.plan.records if isinstance(r, Move)}
    assert ids <= moved  # without the facts they must be copied back
    assert not any(isinstance(r, Fill) for r in without.plan.records)
    records = with_facts.plan.records
    assert not any(isinstance(r, Move) and r.tensor in ids for r in records)
    fills = [r for r in records if isinstance(r, Fill)]
    assert {(r.tensor, r.value) for r in fills} == {(tid_of(graph, n), v) for n, v in FACTS}
    assert with_facts.predicted_time_s < without.predicted_time_s
    assert with_facts.plan.header.counts["fills"] == len(fills)


def test_the_executor_fills_and_gives_the_same_results(graph):
    without, with_facts = _plans(graph, strategy="async")
    plain = run_steps(graph, without.plan, steps=2, device="cpu")
    filled = run_steps(graph, with_facts.plan, steps=2, device="cpu")
    for a, b in zip(plain, filled, strict=True):
        for tid in a:
            assert torch.allclose(a[tid], b[tid]) and torch.equal(a[tid], b[tid])


def test_fills_at_planned_addresses(graph):
    """The GPU default (an arena at planned offsets) on the CPU: each fill writes its slot."""
    costs = costs_of(graph)
    results = []
    for fills in ((), FACTS):
        res = api.optimize(graph, config(fills, run=None), costs=costs)
        assert res.plan.arena is not None
        results.append(run_steps(graph, res.plan, steps=2, device="cpu",
                                 mode=res.plan.header.run.on("cpu")))
    for a, b in zip(*results, strict=True):
        assert all(torch.equal(a[t], b[t]) for t in a)


def test_the_simulator_prices_fills_and_the_plan_round_trips(graph, tmp_path):
    _, with_facts = _plans(graph, strategy="sync")
    plan = with_facts.plan
    sim = api.simulate(graph, plan, costs=costs_of(graph))
    assert sim.ok and sim.filled_bytes > 0 and not sim.bytes_moved
    path = plan.save(tmp_path / "plan.json")
    again = Plan.load(path).validate(graph)
    assert again.records == plan.records
    doc = json.loads(path.read_text())
    assert {"op": "fill", "tensor": tid_of(graph, "mask"), "value": 0.0} in doc["records"]


def test_facts_apply_in_gpu_mode_only_and_never_to_carried_tensors(graph):
    costs = costs_of(graph)
    gpu = machine_for(graph, config(FACTS), costs)
    assert fill_candidates(gpu, FACTS) == {tid_of(graph, "mask"): 0.0, tid_of(graph, "scale"): 2.0}
    host = machine_for(graph, config(FACTS, device="cpu", memory="optane", run=None),
                       KernelCosts.from_times("cpu", costs.times_s))
    assert fill_candidates(host, FACTS) == {}
    assert fill_candidates(gpu, (("no-such-tensor", 0.0),)) == {}


def test_report_values_shows_a_table_and_a_figure(profile, tmp_path, capsys):
    path = tmp_path / "values.json"
    path.write_text(json.dumps(profile))
    out = tmp_path / "report"
    assert main(["report", "--values", str(path), "-o", str(out), "--format", "png"]) == 0
    text = capsys.readouterr().out
    assert "zero" in text and "mask" in text and "random" in text
    assert (out / "values.png").stat().st_size > 0
    assert main(["report", "-o", str(out)]) == 2  # neither a plan nor --values


def test_optimize_reads_a_value_file(tmp_path, profile):
    path = tmp_path / "values.json"
    path.write_text(json.dumps(profile))
    assert api.value_fills(api.load_values(path)) == FACTS
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(Exception, match="not a value profile"):
        api.load_values(tmp_path / "bad.json")


def test_default_plans_are_unchanged(graph):
    assert PlanConfig().fills == ()
    res = api.optimize(graph, replace(config(), fills=()), costs=costs_of(graph))
    assert not any(isinstance(r, Fill) for r in res.plan.records)


def test_a_plan_with_fills_reports(graph, tmp_path):
    """The report's residency walk, figures and trace read Fill records."""
    from autotm_py.report import make_report

    _, with_facts = _plans(graph, strategy="sync")
    sim = api.simulate(graph, with_facts.plan, costs=costs_of(graph))
    result = make_report(with_facts.plan, tmp_path, graph=graph, simulation=sim.to_dict(),
                         trace_path=tmp_path / "trace.json", formats=("png",))
    assert result.files and (tmp_path / "trace.json").stat().st_size > 0
