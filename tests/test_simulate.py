"""The simulator: timeline rules, memory curve, and strict mode as the verifier."""

import json

import pytest

from autotm_py.costs import KernelCosts
from autotm_py.errors import PlanError
from autotm_py.memory.tiers import FAST, SLOW, preset
from autotm_py.pipeline import simulate
from autotm_py.plan import Compute, Free, Move, Plan, PlanHeader, Recompute, names_table
from tests.graphs import small_training
from tests.synthetic import chain

MB = 2**20


def make_plan(graph, records, initial, memory="h100-pcie5", budget=None, pin=False):
    mem = preset(memory).with_budget(budget)
    header = PlanHeader(graph.model_hash, graph.name, "hand", budget, mem.to_dict(),
                        config={"device": "cuda", "pin_weights": pin}, device="cuda",
                        pin_weights=pin)
    return Plan(header, initial, tuple(records), names_table(graph))


def chain_plan(budget=None):
    """chain(3) with 1 MiB tensors: x -> a0 -> a1 -> a2; a0 evicted and read back."""
    g = chain(3, size=MB // 4)
    x, a0, a1, a2 = 0, 1, 2, 3
    records = [
        Compute(0, (FAST, FAST)), Free(x, FAST),
        Compute(1, (FAST, FAST)), Free(a0, FAST),
        Compute(2, (FAST, FAST)), Free(a1, FAST),
    ]
    return g, records, {x: (FAST,)}, (x, a0, a1, a2)


def costs(graph, seconds=1e-3):
    return KernelCosts.from_times("cuda", [seconds] * len(graph.kernels))


def test_plain_plan_time_and_memory_curve():
    g, records, initial, _ = chain_plan()
    res = simulate(g, make_plan(g, records, initial), costs=costs(g))
    assert res.total_s == pytest.approx(3e-3)
    assert res.fast_peak_bytes == 2 * MB
    assert [k.start_s for k in res.kernels] == pytest.approx([0, 1e-3, 2e-3])
    assert len(res.memory["fast_bytes"]) == len(records) + 1  # the start, then every record
    json.dumps(res.to_dict())  # serializable


def test_sync_moves_add_serially_async_overlap():
    g, _, initial, (x, a0, a1, _) = chain_plan()
    link = preset("h100-pcie5").link
    write = link.latency_s + MB / link.write_bw
    sync = [Compute(0, (FAST, FAST)), Free(x, FAST), Move(a0, SLOW, "sync"), Free(a0, FAST),
            Move(a0, FAST, "sync"), Compute(1, (FAST, FAST)), Free(a0, FAST), Free(a0, SLOW),
            Compute(2, (FAST, FAST)), Free(a1, FAST)]
    res = simulate(g, make_plan(g, sync, initial), costs=costs(g))
    read = link.latency_s + MB / link.read_bw
    assert res.total_s == pytest.approx(3e-3 + write + read)
    # an async write of a0 over kernel 1 is hidden by a long kernel
    hidden = [Compute(0, (FAST, FAST)), Free(x, FAST), Move(a0, SLOW, "async", 1),
              Compute(1, (FAST, FAST)), Free(a0, FAST), Free(a0, SLOW),
              Compute(2, (FAST, FAST)), Free(a1, FAST)]
    res = simulate(g, make_plan(g, hidden, initial), costs=costs(g, 1.0))
    assert res.total_s == pytest.approx(3.0)
    move = res.moves[0]
    assert (move.stream, move.mode, move.overlaps) == ("d2h", "async", 1)
    assert move.start_s == pytest.approx(1.0)
    # ... and exposed by a short one: the free of a0 right after kernel 1 waits for the
    # copy (the join at its use), so kernel 2 starts when the copy ends
    res = simulate(g, make_plan(g, hidden, initial), costs=costs(g, 1e-9))
    assert res.kernels[2].start_s - res.kernels[1].start_s == pytest.approx(
        link.latency_s + MB / link.async_write_bw)


def skip_graph(size):
    """x -> a0 -> a1 -> a2, then y = a2 + x: x is read again three kernels later."""
    from autotm_py.ir import GraphBuilder, Role

    b = GraphBuilder("skip")
    x = b.add_tensor("x", (size,), "float32", Role.INPUT)
    b.inputs.append(x)
    prev = x
    for i in range(3):
        out = b.add_tensor(f"a{i}", (size,), "float32", Role.ACTIVATION)
        b.add_kernel("Relu", [prev], [out], name=f"relu{i}")
        prev = out
    y = b.add_tensor("y", (size,), "float32", Role.OUTPUT)
    b.add_kernel("Add", [prev, x], [y], name="add")
    b.outputs.append(y)
    return b.build()


def prefetch_records(g):
    """x (in both tiers) is dropped after kernel 0 and prefetched over kernel 1 for the add."""
    x, a0, a1, a2, _ = range(5)
    return [Compute(0, (FAST, FAST)), Free(x, FAST), Move(x, FAST, "async", 1),
            Compute(1, (FAST, FAST)), Free(a0, FAST), Compute(2, (FAST, FAST)), Free(a1, FAST),
            Compute(3, (FAST, FAST, FAST)), Free(a2, FAST), Free(x, FAST), Free(x, SLOW)]


def test_a_prefetch_runs_on_beside_later_kernels_and_joins_at_its_use():
    g = skip_graph(64 * MB // 4)
    link = preset("h100-pcie5").link
    read = link.latency_s + 64 * MB / link.async_read_bw
    plan = make_plan(g, prefetch_records(g), {0: (FAST, SLOW)})
    # kernels of 1 ms: the 1.2 ms read overlaps kernels 1 and 2 and is done before the add;
    # joined at the end of kernel 1 (AutoTM's step) the iteration would take read + 3 ms
    kernel = 1e-3
    assert read > kernel
    res = simulate(g, plan, costs=costs(g, kernel))
    assert res.total_s == pytest.approx(4 * kernel)
    assert res.kernels[1].step_end_s == pytest.approx(2 * kernel)  # no join after kernel 1
    assert res.moves[0].end_s == pytest.approx(kernel + read)
    # kernels of 0.1 ms: the add waits for the copy to land, and nothing else does
    res = simulate(g, plan, costs=costs(g, 1e-4))
    assert res.kernels[3].start_s == pytest.approx(1e-4 + read)
    assert res.total_s == pytest.approx(2e-4 + read)


@pytest.mark.parametrize("records, message", [
    ([Compute(0, (FAST, FAST)), Free(0, FAST), Compute(1, (SLOW, FAST))],
     "GPU mode"),
    ([Compute(0, (FAST, FAST)), Free(0, FAST), Free(1, FAST), Compute(1, (FAST, FAST))],
     "read after it was freed"),
    ([Move(1, FAST, "sync"), Compute(0, (FAST, FAST))], "read before kernel #0"),
    ([Move(0, SLOW, "sync"), Move(0, SLOW, "sync")], "already in the slow tier"),
    ([Compute(0, (FAST, FAST)), Move(1, FAST, "sync")], "not resident in the slow tier"),
    ([Compute(0, (FAST, FAST)), Free(0, SLOW)], "where it is not there"),
    ([Compute(0, (FAST, FAST)), Move(1, SLOW, "async", 2), Compute(1, (FAST, FAST))],
     "overlaps kernel #2"),
    ([Compute(0, (FAST, FAST)), Free(0, FAST), Compute(1, (FAST, FAST)),
      Compute(2, (FAST, FAST))], "never freed"),
])
def test_verifier_names_the_record(records, message):
    g, _, initial, _ = chain_plan()
    complete = list(records)
    done = {r.kernel for r in records if isinstance(r, Compute)}
    complete += [Compute(k, (FAST, FAST)) for k in range(3) if k not in done]
    with pytest.raises(PlanError, match=message) as info:
        simulate(g, make_plan(g, complete, initial), costs=costs(g))
    assert str(info.value).startswith(("record #", "end of plan"))


def recompute_plan(before_rerun=(), after_rerun=None):
    """chain(3): a1 is dropped after kernel 1 (no copy anywhere) and regenerated before kernel
    2 by re-running kernel 1, which needs a0 in fast memory; `before_rerun` is inserted before
    the re-run, `after_rerun` (a0's free) after it."""
    g, _, initial, (x, a0, a1, _) = chain_plan()
    after_rerun = (Free(a0, FAST),) if after_rerun is None else after_rerun
    records = [Compute(0, (FAST, FAST)), Free(x, FAST), Compute(1, (FAST, FAST)),
               Free(a1, FAST), *before_rerun, Recompute(1, (a1,), 2), *after_rerun,
               Compute(2, (FAST, FAST)), Free(a1, FAST)]
    return g, make_plan(g, records, initial)


def test_a_regeneration_recreates_its_outputs_and_takes_its_time():
    g, plan = recompute_plan()
    res = simulate(g, plan, costs=costs(g))
    assert res.total_s == pytest.approx(4e-3)  # three kernels and one re-run
    (span,) = res.recomputes
    assert (span.kernel, span.outputs, span.before) == (1, (2,), 2)
    assert res.recompute_s == pytest.approx(1e-3)


@pytest.mark.parametrize("before, after, message", [
    # the re-run's input a0 was freed (absent) before the regeneration
    ((Free(1, FAST),), (), "recompute input 'a0' is read after it was freed"),
    # a0 is only in the slow tier: a regeneration reads fast memory
    ((Move(1, SLOW, "sync"), Free(1, FAST)), (Free(1, SLOW),), "recompute input 'a0' is not "
     "resident in the fast tier"),
    # a1 regenerated while it is still in fast memory (its output is not absent)
    ((Recompute(1, (2,), 2),), (Free(1, FAST),), "regenerated while it is in the fast tier"),
])
def test_verifier_rejects_a_regeneration_without_its_inputs_in_fast_memory(before, after,
                                                                            message):
    g, plan = recompute_plan(before, after)
    with pytest.raises(PlanError, match=message):
        simulate(g, plan, costs=costs(g))


def test_budget_and_async_arrival_violations():
    g, records, initial, (x, a0, a1, _) = chain_plan()
    with pytest.raises(PlanError, match="over the budget"):
        simulate(g, make_plan(g, records, initial, budget=MB), costs=costs(g))
    early = [Compute(0, (FAST, FAST)), Free(x, FAST), Move(a0, SLOW, "sync"), Free(a0, FAST),
             Move(a0, FAST, "async", 1), Compute(1, (FAST, FAST)), Free(a0, FAST),
             Free(a0, SLOW), Compute(2, (FAST, FAST)), Free(a1, FAST)]
    with pytest.raises(PlanError, match="still running"):
        simulate(g, make_plan(g, early, initial), costs=costs(g))


def test_non_strict_collects_violations():
    g, records, initial, _ = chain_plan()
    res = simulate(g, make_plan(g, records, initial, budget=MB), costs=costs(g), strict=False)
    assert not res.ok and len(res.violations) >= 2
    assert res.fast_peak_bytes == 2 * MB


def test_carried_tensor_must_return():
    g = small_training(kib=64)
    w, _ = g.carried[0]
    plan_records = []
    for k, kernel in enumerate(g.kernels):
        plan_records.append(Compute(k, (FAST,) * len(kernel.io)))
        for t in kernel.inputs:
            if g.live_ranges[t][1] == k:
                plan_records.append(Free(t, FAST))
    initial = {t.id: (FAST,) for t in g.tensors if t.producer is None}
    initial[w] = (SLOW,)
    plan_records.insert(0, Move(w, FAST, "sync"))
    plan_records.insert(plan_records.index(Free(w, FAST)) + 1, Free(w, SLOW))
    with pytest.raises(PlanError, match="started in \\['slow'\\]"):
        simulate(g, make_plan(g, plan_records, initial), costs=costs(g))
    initial[w] = (FAST,)
    plan_records = [r for r in plan_records if r not in (Move(w, FAST, "sync"), Free(w, SLOW))]
    simulate(g, make_plan(g, plan_records, initial), costs=costs(g))  # steady: passes


def test_pinned_tensors_are_outside_the_budget():
    g = small_training(kib=64)
    records = []
    for k, kernel in enumerate(g.kernels):
        records.append(Compute(k, (FAST,) * len(kernel.io)))
        records += [Free(t, FAST) for t in kernel.io if g.live_ranges[t][1] == k
                    and t not in (g.outputs) and g.tensors[t].producer is not None]
    initial = {t.id: (FAST,) for t in g.tensors if t.producer is None}
    plan = make_plan(g, records, initial, budget=10**9, pin=True)
    res = simulate(g, plan, costs=costs(g))
    assert res.pinned_bytes > 0
    w = g.carried[0][0]
    moved = make_plan(g, [Move(w, SLOW, "sync"), *records], initial, pin=True)
    with pytest.raises(PlanError, match="pinned"):
        simulate(g, moved, costs=costs(g))


def test_plan_of_another_graph_is_rejected():
    g, records, initial, _ = chain_plan()
    plan = make_plan(g, records, initial)
    with pytest.raises(PlanError, match="not for"):
        simulate(chain(4), plan, costs=costs(chain(4)))


def test_link_contention_stretches_both_engines():
    """An overlapped read and write in one GPU step share the both-ways bandwidth."""
    from autotm_py.ir import GraphBuilder, Role

    b = GraphBuilder("contention")
    big = (16 * MB,)  # 64 MiB float32 tensors: the shared link binds, not the latency
    x, y = b.add_tensor("x", big, "float32", Role.INPUT), b.add_tensor("y", big, "float32",
                                                                        Role.INPUT)
    a, t, c, d = (b.add_tensor(n, big, "float32", Role.ACTIVATION) for n in "abcd")
    b.add_kernel("Relu", [x], [a])
    b.add_kernel("Relu", [a], [t])
    b.add_kernel("Relu", [x], [c])
    b.add_kernel("Sum", [t, c, y], [d])
    b.outputs.append(d)
    g = b.build()
    records = [Compute(0, (FAST, FAST)), Compute(1, (FAST, FAST)), Free(a, FAST),
               Move(t, SLOW, "async", 2), Move(y, FAST, "async", 2), Compute(2, (FAST, FAST)),
               Free(x, FAST), Free(t, FAST), Move(t, FAST, "sync"),
               Compute(3, (FAST,) * 4), Free(t, FAST), Free(t, SLOW), Free(c, FAST),
               Free(y, FAST), Free(y, SLOW)]
    res = simulate(g, make_plan(g, records, {x: (FAST,), y: (SLOW,)}), costs=costs(g, 1e-9))
    link = preset("h100-pcie5").link
    nbytes = 64 * MB
    shared = 2 * nbytes / link.both_directions_bw
    assert shared > link.latency_s + nbytes / link.async_read_bw  # the link binds
    step = res.kernels[2]
    overlapped = [m for m in res.moves if m.mode == "async"]
    assert {m.stream for m in overlapped} == {"h2d", "d2h"}
    assert max(m.end_s for m in overlapped) - step.start_s == pytest.approx(shared)
    # the free of t after kernel 2 waits for its copy out; kernel 3 then reads it back
    assert res.kernels[3].start_s >= step.start_s + shared


def test_free_of_a_copy_source_waits_for_the_copy():
    """A fast copy freed while an async copy still reads it keeps its bytes to the step end."""
    g, _, initial, (x, a0, _, _) = chain_plan()
    records = [Compute(0, (FAST, FAST)), Free(x, FAST), Move(a0, SLOW, "async", 1),
               Free(a0, FAST), Compute(1, (SLOW, FAST)), Free(a0, SLOW),
               Compute(2, (FAST, FAST)), Free(2, FAST)]
    res = simulate(g, make_plan(g, records, initial, memory="optane"),
                   costs=KernelCosts.from_times("cpu", [1e-3] * 3), strict=False)
    # reading a0 from the slow tier while its copy is still running is a violation ...
    assert any("still running" in v for v in res.violations)
    # ... and its fast bytes stayed counted through kernel 1 (a0 + a1 = 2 MiB)
    compute1 = res.memory["record"].index(4)
    assert res.memory["fast_bytes"][compute1] == 2 * MB


def test_device_times_let_a_sync_copy_hide_launch_gaps():
    """Two clocks (profiles with device times): kernels of 1 ms in context but 0.25 ms of GPU
    work are host-bound; a sync copy holds the GPU back while the host dispatches ahead, so
    the kernel after it starts as soon as the copy ends. Without device times, or without
    copies, the prediction is the plain sum."""
    from dataclasses import replace

    g, _, initial, (x, a0, a1, _) = chain_plan()
    link = preset("h100-pcie5").link
    write = link.latency_s + MB / link.write_bw
    read = link.latency_s + MB / link.read_bw
    sync = [Compute(0, (FAST, FAST)), Free(x, FAST), Move(a0, SLOW, "sync"), Free(a0, FAST),
            Move(a0, FAST, "sync"), Compute(1, (FAST, FAST)), Free(a0, FAST), Free(a0, SLOW),
            Compute(2, (FAST, FAST)), Free(a1, FAST)]
    plain, plan = costs(g), make_plan(g, sync, initial)
    two_clocks = replace(plain, device_s=(0.25e-3,) * 3)
    assert simulate(g, plan, costs=plain).total_s == pytest.approx(3e-3 + write + read)
    # a kernel ends no earlier than its dispatch: kernel 0 at 1 ms; the copies run to
    # 1 + write + read ms, long past kernel 1's dispatch (2 ms), so kernel 1 follows them at
    # once; kernel 2 ends with its dispatch (3 ms) unless the GPU is later still
    copies_end = 1e-3 + write + read
    expected = max(copies_end + 0.25e-3, 2e-3)
    expected = max(expected + 0.25e-3, 3e-3)
    assert simulate(g, plan, costs=two_clocks).total_s == pytest.approx(expected)
    assert simulate(g, plan, costs=two_clocks).total_s < simulate(g, plan, costs=plain).total_s
    g2, records, initial2, _ = chain_plan()
    no_moves = make_plan(g2, records, initial2)
    assert simulate(g2, no_moves, costs=replace(costs(g2), device_s=(0.25e-3,) * 3)
                    ).total_s == pytest.approx(3e-3)  # host-bound: the dispatch sum
