"""The planner through `optimize`: statuses, infeasibility, steady state, pinning, solvers,
decoding, and plan round trips."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from autotm_py.config import PlanConfig
from autotm_py.errors import ConfigError, PlanError
from autotm_py.machine import MachineModel
from autotm_py.memory.tiers import FAST, SLOW, preset
from autotm_py.options import RunMode
from autotm_py.pipeline import optimize, simulate
from autotm_py.plan import Compute, Free, Move, Plan
from autotm_py.planning import formulation
from autotm_py.planning.decode import Walk, fast_intervals, prune_reads
from autotm_py.planning.feasibility import min_feasible_budget
from autotm_py.planning.gadgets import ASYNC, NONE, SYNC, tensor_gadgets
from autotm_py.planning.paths import DROP, F0, NK, READ, WRITE, S, build_paths
from autotm_py.planning.solvers import parse_cbc_log
from autotm_py.units import parse_ratio
from tests.graphs import costs_for, layered_net, small_training, sync_and_async_at_a_third
from tests.synthetic import chain

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def config(**kw):
    # eager runs on torch's allocator: the budgets below are the MachineModel's (no arena)
    base = {"strategy": "sync", "device": "cuda", "solver": "highs", "gap": 0.0,
            "run": RunMode()}
    return PlanConfig(**{**base, **kw})


@pytest.mark.parametrize("strategy", ["static", "sync", "async"])
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_plans_verify_and_match_objective(strategy, device):
    g = small_training(kib=256)
    costs = costs_for(g, device)
    res = optimize(g, config(strategy=strategy, device=device, ratio=parse_ratio("2:1")),
                   costs=costs)
    if (strategy, device) == ("static", "cuda"):  # nothing moves: only the whole peak fits
        assert res.status == "infeasible" and res.min_feasible_budget_bytes > res.budget_bytes
        return
    assert res.status == "optimal" and res.plan is not None
    sim = simulate(g, res.plan, costs=costs)  # strict: raises on any violation
    # the objective's timeline joins a step's copies at its end (the executor: at their uses)
    joined_at_steps = simulate(g, res.plan, costs=costs, join_at_use=False)
    assert joined_at_steps.total_s == pytest.approx(res.objective_s, rel=1e-3)
    assert sim.total_s <= joined_at_steps.total_s * (1 + 1e-9)
    assert res.predicted_time_s == pytest.approx(sim.total_s)
    assert sim.fast_peak_bytes <= res.budget_bytes
    assert res.stats.variables > 0 and res.stats.constraints > 0
    assert res.stats.build_s >= 0 and res.stats.solve_s > 0


def test_tight_gpu_budget_moves_tensors_and_keeps_steady_state():
    g = small_training(kib=256)
    costs = costs_for(g)
    machine = MachineModel(g, preset("h100-pcie5"), costs)
    need, _ = min_feasible_budget(machine, "sync")
    res = optimize(g, config(fast_mem_bytes=need), costs=costs)
    assert res.status == "optimal"
    moves = list(res.plan.moves())
    assert any(m.to == SLOW for m in moves) and any(m.to == FAST for m in moves)
    assert res.slowdown > 1.0
    simulate(g, res.plan, costs=costs)  # strict: includes "carried tensors end where they began"


def test_infeasible_budget_names_the_forcing_kernel():
    g = chain(4, size=2**18)  # 1 MiB tensors, 2 MiB working sets
    res = optimize(g, config(fast_mem_bytes=2**20), costs=costs_for(g))
    assert res.status == "infeasible" and res.plan is None
    assert res.min_feasible_budget_bytes == 2 * 2**20
    assert res.forcing_kernel == 0 and res.forcing_kernel_name == "relu0"
    assert "2.00 MiB" in res.message and "relu0" in res.message
    static = optimize(g, config(strategy="static", fast_mem_bytes=3 * 2**20),
                      costs=costs_for(g))
    assert static.status == "optimal"  # the peak (2 MiB) fits
    host = optimize(g, config(device="cpu", fast_mem_bytes=0), costs=costs_for(g, "cpu"))
    assert host.status == "optimal"  # host mode can run everything from the slow tier


def test_no_budget_is_all_fast():
    g = chain(3)
    res = optimize(g, config(ratio=parse_ratio("1:0")), costs=costs_for(g))
    assert res.status == "optimal" and res.budget_bytes is None
    assert not list(res.plan.moves())
    assert res.predicted_time_s == pytest.approx(res.all_fast_time_s)


def test_pin_weights_keeps_weights_fast_and_outside_the_budget():
    g = small_training(kib=256)
    costs = costs_for(g)
    res = optimize(g, config(fast_mem_bytes=800 * 1024, pin_weights=True), costs=costs)
    w, w_next = g.carried[0]
    assert res.plan.initial[w] == (FAST,)
    assert all(m.tensor not in (w, w_next) for m in res.plan.moves())
    assert res.plan.header.pin_weights is True
    assert simulate(g, res.plan, costs=costs).pinned_bytes > 0


def test_cbc_and_highs_agree():
    g = small_training(kib=256)
    costs = costs_for(g, "cpu")
    results = [optimize(g, config(solver=s, device="cpu", ratio=parse_ratio("1:3")),
                        costs=costs) for s in ("cbc", "highs")]
    assert results[0].objective_s == pytest.approx(results[1].objective_s, rel=1e-6)


def test_time_limit_returns_a_marked_plan_or_says_none():
    g = layered_net(6, width=4, kib=256)
    costs = costs_for(g)
    res = optimize(g, config(strategy="async", ratio=parse_ratio("1:3"), gap=0.0,
                             time_limit_s=0.5), costs=costs)
    assert res.status in ("optimal", "time_limit", "no_solution")
    if res.status == "time_limit":
        assert res.plan.header.solver.hit_time_limit
        assert any("time limit" in n for n in res.plan.header.notes)
        simulate(g, res.plan, costs=costs)
    if res.status == "no_solution":
        assert res.plan is None and "--time-limit" in res.message


def test_parse_cbc_log():
    import pulp

    stopped = "Result - Stopped on time limit\n\nObjective value: 12.5\nLower bound: 10.0\n" \
              "Gap: 0.25\n"
    assert parse_cbc_log(stopped, pulp.LpStatusOptimal, pulp.LpSolutionIntegerFeasible) == \
        ("time_limit", 10.0, 0.2)
    done = "Result - Optimal solution found\n\nObjective value: 12.5\n"
    assert parse_cbc_log(done, 1, pulp.LpSolutionOptimal) == ("optimal", None, 0.0)
    assert parse_cbc_log("Result - Problem proven infeasible", -1, 0)[0] == "infeasible"


def test_plan_json_roundtrip(tmp_path):
    g = small_training(kib=256)
    costs = costs_for(g)
    res = optimize(g, config(fast_mem_bytes=900 * 1024), costs=costs)
    path = res.plan.save(tmp_path / "plan.json")
    again = Plan.load(path)
    assert again.records == res.plan.records and again.initial == res.plan.initial
    assert simulate(g, again, costs=costs).total_s == pytest.approx(res.predicted_time_s)
    assert json.loads(path.read_text())["header"]["solver"]["solver"] == "highs"
    packed = res.plan.save(tmp_path / "plan.json.gz")  # compressed when the name says so
    assert packed.read_bytes()[:2] == b"\x1f\x8b" and packed.stat().st_size < path.stat().st_size
    assert Plan.load(packed).records == res.plan.records
    (tmp_path / "bad.json.gz").write_bytes(b"\x1f\x8b" + b"not gzip")
    with pytest.raises(PlanError, match=r"cannot read plan .*bad\.json\.gz"):
        Plan.load(tmp_path / "bad.json.gz")


def test_gadgets_per_strategy():
    g = small_training()
    machine = MachineModel(g, preset("h100-pcie5"), costs_for(g))
    h = g.by_name("h").id  # produced by kernel 0, read by kernels 1 and 4
    static = tensor_gadgets(machine, "static", 15)[h]
    sync = tensor_gadgets(machine, "sync", 15)[h]
    asyn = tensor_gadgets(machine, "async", 1)[h]
    assert static.kernels == (0,) and static.write == (NONE,)
    assert sync.kernels == (0, 1, 4) and sync.read == (NONE, SYNC, SYNC)
    assert asyn.kernels == (0, 1, 2, 3, 4)
    assert asyn.read[3] == ASYNC and asyn.write[2] == ASYNC and asyn.read[2] == NONE


def test_paths_forbid_slow_io_on_gpu():
    g = small_training()
    gpu = MachineModel(g, preset("h100-pcie5"), costs_for(g))
    h = g.by_name("h").id
    p = build_paths(tensor_gadgets(gpu, "sync", 15)[h], gpu=True, carried_end=False)
    assert F0 in p.start and S not in p.start  # a GPU kernel writes its outputs to fast memory
    s_at_user = 1 * NK + S
    assert [e.kind for e in p.edges if e.src == s_at_user] == [READ]


def test_prune_reads_without_consumer():
    g = small_training()
    machine = MachineModel(g, preset("h100-pcie5"), costs_for(g))
    x = g.by_name("x").id  # given, read by kernels 0 and 5; async gadgets around them
    p = build_paths(tensor_gadgets(machine, "async", 2)[x], gpu=True, carried_end=False)
    kernels = p.gadgets.kernels
    j = kernels.index(1)
    useless = Walk(F0, [(0, "write"), (j, READ), (j + 1, DROP)])
    pruned = prune_reads(p, useless, g.tensors[x].users)
    assert pruned.events == [(0, "write")]
    assert fast_intervals(p, pruned, 0, 5) == [(0, 0)]


def test_formulation_units_and_sizes():
    g = layered_net(3, width=3, kib=512)
    machine = MachineModel(g, preset("h100-pcie5").with_budget(64 * 2**20), costs_for(g))
    f = formulation.build(machine, "sync", 15)
    assert f.n_vars > 0 and f.n_rows > 0 and f.build_s < 10
    caps = [v for v in f.prob.variables() if v.name.startswith("U")]
    assert len(caps) == len(g.kernels)
    assert max(v.upBound for v in caps) <= 64  # MiB


def test_plan_moves_are_well_formed():
    g = small_training(kib=256)
    res = optimize(g, config(strategy="async", fast_mem_bytes=900 * 1024), costs=costs_for(g))
    for m in res.plan.moves():
        assert isinstance(m, Move)
        assert (m.mode == "async") == (m.overlaps is not None)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_sync_solution_is_a_feasible_start_of_the_async_model(device):
    import pulp

    from autotm_py.planning import warmstart
    from autotm_py.planning.solvers import run_solver

    g = layered_net(3, width=3, kib=256)
    costs = costs_for(g, device)
    memory = preset("h100-pcie5" if device == "cuda" else "optane")
    probe = MachineModel(g, memory, costs)
    machine = MachineModel(g, memory.with_budget(probe.peak[0] // 3), costs)
    sync = formulation.build(machine, "sync", 15)
    first = run_solver(sync.prob, "highs", gap=0.0, time_limit=60)
    asyn = formulation.build(machine, "async", 15, candidates=2)
    assert warmstart.apply(asyn, warmstart.events_of(sync))
    for c in asyn.prob._constraints.values():
        activity = sum(coef * v.varValue for v, coef in c.items()) + c.constant
        assert (activity <= 1e-6 if c.sense == pulp.LpConstraintLE else
                activity >= -1e-6 if c.sense == pulp.LpConstraintGE else abs(activity) < 1e-6)
    assert pulp.value(asyn.prob.objective) == pytest.approx(first.objective, rel=1e-9)
    res = optimize(g, config(strategy="async", device=device, fast_mem_bytes=machine.tensor_budget,
                             async_candidates=2, recompute="off"), costs=costs)
    assert any("started from the sync plan" in n for n in res.plan.header.notes)
    assert res.objective_s <= first.objective / formulation.MS * (1 + 1e-9)


def test_overlapping_the_sync_plans_copies_gives_a_faster_feasible_start():
    """The async model's start: the sync plan with its blocking reads hoisted into async read
    gadgets and its writes delayed where memory allows holds every row and is faster (a 3B
    decoder's async search found nothing better than the sync plan in minutes without it)."""
    from autotm_py.planning import warmstart
    from autotm_py.planning.solvers import run_solver

    sync, asyn = sync_and_async_at_a_third(3)
    base = warmstart.events_of(sync)
    assert warmstart.apply(asyn, base)
    blocking = warmstart.objective_value(asyn)
    overlapped = warmstart.overlap_copies(asyn, base)
    assert overlapped is not None
    kinds = {kind for _, evs in overlapped.values() for _, kind in evs}
    assert warmstart.READ_ASYNC in kinds
    assert warmstart.apply(asyn, overlapped)
    assert warmstart.holds(asyn)
    start = warmstart.objective_value(asyn)
    assert start < blocking
    best = run_solver(asyn.prob, "highs", gap=0.0, time_limit=60)
    assert best.objective <= start * (1 + 1e-9)


def test_highs_warm_start_returns_the_solution_it_reports():
    """HiGHS 1.16, started from this sync+recompute plan, reports the async+recompute optimum
    but hands back the start's values (CI's slow profile drew the case: the joint plan came out
    0.19% worse than the move-only plan it contains). `run_solver` then solves again without
    the start, so the values returned are the optimum's."""
    import pulp

    from autotm_py.planning import solve as solve_module
    from autotm_py.planning import warmstart
    from autotm_py.planning.solvers import run_solver
    from tests.graphs import random_training

    g = random_training(4, n_forward=4)
    costs = costs_for(g, "cpu", seed=len(g.kernels), scale_s=2e-6)
    cfg = PlanConfig.for_plan_name("async+recompute", device="cpu", memory="optane",
                                   fast_mem_bytes=16128, solver="highs", gap=0.0,
                                   async_window=4)
    machine = MachineModel(g, preset("optane").with_budget(16128), costs)
    small, spec = solve_module._small_and_recompute(machine, cfg)
    sync = formulation.build(machine, "sync", 4, None, small, recompute=spec)
    run_solver(sync.prob, "highs", gap=0.0, time_limit=60)

    def asyn():
        return formulation.build(machine, "async", 4, cfg.async_candidates, small,
                                 recompute=spec)
    cold = run_solver(asyn().prob, "highs", gap=0.0, time_limit=60)
    warm_model = asyn()
    assert warmstart.apply(warm_model, warmstart.events_of(sync))
    warm = run_solver(warm_model.prob, "highs", gap=0.0, time_limit=60, warm_start=True)
    assert warm.status == "optimal"
    assert warm.objective == pytest.approx(cold.objective, rel=1e-9)
    assert pulp.value(warm_model.prob.objective) == pytest.approx(cold.objective, rel=1e-9)
    moves = optimize(g, replace(cfg, recompute="off"), costs=costs)
    joint = optimize(g, cfg, costs=costs)
    assert joint.objective_s <= moves.objective_s * (1 + 1e-9)


def test_highs_keeps_the_start_when_the_repeat_finds_nothing(monkeypatch):
    """The repeated solve (without the start) finds nothing in the time left: the values are
    the start's, a feasible plan, marked as not proven optimal."""
    import pulp

    from autotm_py.planning import solvers
    from autotm_py.planning.solvers import SolveControl

    prob = pulp.LpProblem("p", pulp.LpMinimize)
    x = prob.add_variable("x", 0, 1, cat="Integer")
    prob += x
    prob += x >= 0
    calls = []

    def once(prob, gap, time_limit, threads, warm_start, control):
        calls.append(warm_start)
        x.varValue = 1.0 if warm_start else None  # the start came back; the repeat: nothing
        return solvers._Ended("optimal") if warm_start else solvers._Ended("no_solution")

    monkeypatch.setattr(solvers, "_solve_highs_once", once)
    monkeypatch.setattr(solvers, "_returned_another_solution", lambda prob: True)
    ended = solvers._solve_highs(prob, 0.0, 10.0, None, True, SolveControl())
    assert calls == [True, False]
    assert ended.status == "time_limit" and ended.has_values and x.varValue == 1.0


def test_host_chain_is_monotone_and_falls_back(monkeypatch):
    """static -> sync -> async warm starts: each plan is at least as good as the one before;
    when the last search finds nothing in time, the best earlier plan is returned, marked."""
    from autotm_py.planning import solve as solve_module

    g = layered_net(2, width=3, kib=256)
    costs = costs_for(g, "cpu")
    times = {}
    for strategy in ("static", "sync", "async"):
        res = optimize(g, config(strategy=strategy, device="cpu", ratio=parse_ratio("1:4"),
                                 gap=0.01), costs=costs)
        times[strategy] = res.predicted_time_s
    assert times["async"] <= times["sync"] * (1 + 1e-9) <= times["static"] * (1 + 1e-9)
    real = solve_module._solve

    def no_async(f, cfg, left, *, warm, control):
        out = real(f, cfg, left, warm=warm, control=control)
        return replace(out, status="no_solution") if f.strategy == "async" else out

    monkeypatch.setattr(solve_module, "_solve", no_async)
    res = optimize(g, config(strategy="async", device="cpu", ratio=parse_ratio("1:4")),
                   costs=costs)
    assert res.status == "time_limit" and res.plan.header.solver.hit_time_limit
    assert any("this is the sync plan" in n for n in res.plan.header.notes)
    simulate(g, res.plan, costs=costs)


def test_plan_header_records_how_the_graph_was_made(tmp_path):
    from autotm_py import api
    from autotm_py.options import ModelOptions

    g = api.load_model(str(FIXTURES / "tiny_gpt_opset17.onnx"), batch=2, dims={"seq": 16},
                       training=True, optimizer="adam")
    res = api.optimize(g, config(ratio=parse_ratio("1:2"), device="cpu", memory="optane"))
    header = Plan.from_json(res.plan.to_json()).header
    assert (header.device, header.pin_weights, header.headroom) == ("cpu", False, 0.0)
    assert header.model == ModelOptions(batch=2, dims={"batch": 2, "seq": 16}, training=True,
                                        optimizer="adam", fuse=True, loss="auto")
    other = ModelOptions.of_graph(api.load_model(str(FIXTURES / "tiny_gpt_opset17.onnx"),
                                                 batch=4, dims={"seq": 16}))
    assert header.model.differences(other) == [
        "batch 4 (the plan's: 2)", "dims {'batch': 4, 'seq': 16} (the plan's: {'batch': 2, "
        "'seq': 16})", "training False (the plan's: True)", "optimizer None (the plan's: "
        "'adam')", "loss None (the plan's: 'auto')"]


def test_version_1_plans_are_read_with_typed_fields_from_their_config():
    import gzip

    # a plan of the first GPU benchmark (2026-11-26: VGG19 b64 at 3:1, sync, 10% headroom),
    # kept from experiments/plans/gpu when those plans were removed
    kept = FIXTURES / "plan_v1_vgg19_3-1_sync_h0.10.json.gz"
    doc = json.loads(gzip.decompress(kept.read_bytes()))
    assert doc["format_version"] == 1
    header = Plan.load(kept).header
    assert header.format_version == 3 and header.model is None
    assert header.run == RunMode(placed=False, scratch="region")  # eager, caching allocator
    assert header.device == doc["header"]["config"]["device"]
    assert header.headroom == (doc["header"]["config"].get("headroom") or 0.0)
    assert header.pin_weights == doc["header"]["config"].get("pin_weights", False)


def test_a_re_run_decision_needs_a_regeneration():
    """z_{p,u} <= sum of the regenerations it stands for (family 8): a multi-output producer's
    re-run decision at 1 with none of its outputs regenerated was feasible, and a solve stopped
    within its MIP gap returned one (CI's slow profile: a recompute-only CNN plan whose
    objective charged a re-run of 0.117 ms that the decoded plan does not contain). Here the
    layer norms of a small decoder (Y and its saved statistics; a batch norm's re-run
    regenerates only Y, `ir.rerun`), at a budget where some are re-run."""
    from autotm_py.ir.training import derive_training
    from autotm_py.pipeline import machine_for
    from autotm_py.planning import solve as solve_module
    from tests.test_training_models import tiny_decoder

    graph = derive_training(tiny_decoder(), optimizer="sgd")
    costs = costs_for(graph, "cuda")
    cfg = PlanConfig.for_plan_name("recompute-only", device="cuda", memory="h100-pcie5",
                                   fast_mem_bytes=graph.peak_live_bytes, solver="highs",
                                   gap=0.01, async_window=8, pin_weights=True)
    machine = machine_for(graph, cfg, costs)
    small, spec = solve_module._small_and_recompute(machine, cfg)
    f = formulation.build(machine, "sync", 8, None, small, recompute=spec, moves=False)
    shared = [(z, kept) for z, kept in f.regen.values() if z is not None]
    assert shared, "no multi-output re-run decision to check"
    rows = [dict(c.items()) for c in f.prob.constraints() if c.sense == -1]
    for z, kept in shared:
        assert {z: 1.0, **{v: -1.0 for v in kept.values()}} in rows, z.name
    result = optimize(graph, cfg, costs=costs)
    assert any(True for _ in result.plan.recomputes())
    sim = simulate(graph, result.plan, costs=costs)
    assert sim.total_s == pytest.approx(result.objective_s, rel=1e-6)


def async_edges(f, kind: str):
    """(tensor, its paths, edge index, edge) of every async READ or WRITE edge of `f`."""
    for tid, p in enumerate(f.paths):
        if p is None:
            continue
        modes = p.gadgets.read if kind == READ else p.gadgets.write
        for i, e in enumerate(p.edges):
            if e.kind == kind and modes[e.layer] == ASYNC:
                yield tid, p, i, e


def test_spread_reads_price_an_async_read_over_the_kernels_until_its_use():
    """`read_pricing="spread"`: an async read issued beside kernel k of a tensor next used at
    kernel u adds its copy time to the terms of kernels k..u-1, each its share by kernel time;
    `"step"`: all of it to kernel k (AutoTM's join at the end of that kernel)."""
    g = small_training(kib=256)
    machine = MachineModel(g, preset("h100-pcie5").with_budget(None), costs_for(g))
    spread = formulation.build(machine, "async", 4, spread_reads=True)
    step = formulation.build(machine, "async", 4, spread_reads=False)
    checked = 0
    for tid, p, i, e in async_edges(spread, READ):
        issue = p.gadgets.kernels[e.layer]
        use = min(k for k, io in zip(p.gadgets.kernels, p.gadgets.io, strict=True)
                  if io and k > issue)
        shares = dict(formulation.read_shares(spread, p, e.layer))
        times = {k: machine.fast_time(k) for k in range(issue, use)}
        assert set(shares) == {k for k, t in times.items() if t > 0}
        assert sum(shares.values()) == pytest.approx(1.0)
        seconds = machine.copying.async_terms(int(g.tensor_bytes[tid]), FAST)[0][1]
        for k, share in shares.items():
            assert share == pytest.approx(times[k] / sum(times.values()))
            lane = spread.async_terms[k][machine.memory.stream_of(FAST)]
            assert lane[spread.x[tid][i]] == pytest.approx(seconds * share)
        alone = step.async_terms[issue][machine.memory.stream_of(FAST)]
        assert alone[step.x[tid][i]] == pytest.approx(seconds)
        checked += len(shares) > 1
    assert checked  # some read spans several kernels


def test_spread_writes_price_a_write_over_the_kernels_that_cover_it():
    """`write_pricing="spread"`: an async write issued beside kernel k adds its copy time to
    the terms of k and the kernels after it, each its share by kernel time, up to the first
    whose time covers the copy (or the kernel before the tensor's next gadget that may read or
    use it); its source holds its memory in the capacity rows over that span, and the plan
    frees it after the span's last kernel. `"step"`: all of it at k, freed after k."""
    g = layered_net(3, width=3, kib=1024)
    costs = costs_for(g, scale_s=3e-6)  # short kernels: some copies outlast one
    machine = MachineModel(g, preset("h100-pcie5").with_budget(None), costs)
    spread = formulation.build(machine, "async", 4, spread_writes=True)
    step = formulation.build(machine, "async", 4)
    lane = machine.memory.stream_of(SLOW)
    spans = 0
    for tid, p, i, e in async_edges(spread, WRITE):
        issue = p.gadgets.kernels[e.layer]
        span = formulation.write_span(spread, tid, p, e.layer)
        kernels = [k for k, _ in span]
        assert kernels == list(range(issue, issue + len(kernels)))
        assert sum(s for _, s in span) == pytest.approx(1.0)
        seconds = machine.copying.async_terms(int(g.tensor_bytes[tid]), SLOW)[0][1]
        covered = sum(machine.fast_time(k) for k in kernels[:-1])
        assert covered < seconds  # no kernel more than the copy needs
        later = [k for k, io, j in zip(p.gadgets.kernels, p.gadgets.io,
                                       range(len(p.gadgets.kernels)), strict=True)
                 if k > issue and (io or p.gadgets.reads(j))]
        assert not later or kernels[-1] < later[0]
        for k, share in span:
            if share > 0:
                assert spread.async_terms[k][lane][spread.x[tid][i]] == \
                    pytest.approx(seconds * share)
        assert step.async_terms[issue][lane][step.x[tid][i]] == pytest.approx(seconds)
        spans += len(kernels) > 1
    assert spans  # some write spans several kernels
    need, _ = min_feasible_budget(MachineModel(g, preset("h100-pcie5"), costs), "sync")
    cfg = PlanConfig.for_plan_name("async", device="cuda", memory="h100-pcie5",
                                   fast_mem_bytes=(3 * need + machine.peak[0]) // 4,
                                   solver="highs", gap=0.0, reserve_bytes=0,
                                   write_pricing="spread", run=RunMode())
    res = optimize(g, cfg, costs=costs)
    sim = simulate(g, res.plan, costs=costs)  # strict: the verifier counts the held sources
    assert sim.fast_peak_bytes <= res.budget_bytes
    held = 0
    records = res.plan.records
    for at, rec in enumerate(records):
        if not (isinstance(rec, Move) and rec.to == SLOW and rec.mode == "async"):
            continue
        free = next(i for i in range(at, len(records)) if records[i] == Free(rec.tensor, FAST))
        freed_after = next(r.kernel for r in reversed(records[:free]) if isinstance(r, Compute))
        assert freed_after >= rec.overlaps
        held += freed_after > rec.overlaps
    assert held, "no write's source is held past its kernel: nothing checked"
    assert res.plan.header.config["write_pricing"] == "spread"
    with pytest.raises(ConfigError, match="--write-pricing 'late': choose one of step, spread"):
        PlanConfig(write_pricing="late")


@pytest.mark.parametrize("strategy", ["async", "async+recompute"])
def test_spread_plans_verify_and_never_beat_all_fast(strategy):
    """Spread pricing models the executor's join at use: the objective is no longer the
    step-join timeline (it may be below it); the plan must still verify, fit and, joined at
    use, run no slower than on that timeline."""
    g = small_training(kib=256)
    costs = costs_for(g)
    machine = MachineModel(g, preset("h100-pcie5"), costs)
    need, _ = min_feasible_budget(machine, "sync")
    cfg = PlanConfig.for_plan_name(strategy, device="cuda", fast_mem_bytes=need,
                                   solver="highs", gap=0.0, read_pricing="spread",
                                   run=RunMode())
    res = optimize(g, cfg, costs=costs)
    assert res.status == "optimal" and res.plan is not None
    sim = simulate(g, res.plan, costs=costs)  # strict: the verifier
    joined_at_steps = simulate(g, res.plan, costs=costs, join_at_use=False)
    assert sim.total_s <= joined_at_steps.total_s * (1 + 1e-9)
    assert sim.fast_peak_bytes <= res.budget_bytes
    assert sim.total_s >= res.all_fast_time_s * (1 - 1e-9)
    assert res.plan.header.config["read_pricing"] == "spread"
    with pytest.raises(ConfigError, match="--read-pricing 'late': choose one of step, spread"):
        PlanConfig(read_pricing="late")
