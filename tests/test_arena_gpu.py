"""The arena executor and CUDA-graph replay on a GPU (marked `gpu`: run on the device machine
with `bash experiments/gpu/test_gpu.sh`, i.e. `python -m pytest -m gpu`).

In an arena every plan computes bitwise what it computes on torch's caching allocator (the
kernels written in place are aten's `out=` twins of the usual ones); a replayed CUDA graph
computes bitwise what eager replay of the same plan computes; runs at planned addresses make
the allocator retry nothing and stay within the cap; a kernel that cannot be captured leaves a
note that names it and the run goes on eagerly."""

from __future__ import annotations

import pytest
import torch

from autotm_py.config import PlanConfig
from autotm_py.kernels import INTO, KERNELS, run_kernel, run_kernel_into
from autotm_py.memory.tiers import preset
from autotm_py.options import Measure, RunMode
from autotm_py.pipeline import machine_for, optimize, with_arena
from autotm_py.runtime.drivers import CAPTURE_ALLOWANCE
from autotm_py.runtime.execute import execute, run_steps
from autotm_py.runtime.reference import init_values
from tests.graphs import costs_for
from tests.test_executor import _arena_plans, _graph
from tests.test_executor_gpu import in_own_process, run_without_synchronizing

pytestmark = pytest.mark.gpu
STEPS = 3


@pytest.fixture(scope="module", params=["cnn", "decoder", "cnn-fused", "decoder-fused",
                                        "cnn-cl"])
def arena_plans(request):
    graph = _graph(request.param)
    return graph, _arena_plans(graph)


def _equal(a, b, where: str, graph) -> None:
    for step, (x, y) in enumerate(zip(a, b, strict=True)):
        for tid in graph.outputs:
            assert torch.equal(x[tid], y[tid]), f"{where}, step {step}: {graph.name_of(tid)}"


def test_arena_runs_are_bitwise_the_caching_allocator_runs(arena_plans):
    graph, plans = arena_plans
    for name, plan in plans.items():
        plain = run_steps(graph, plan, steps=STEPS, device="cuda", seed=1)
        placed = run_steps(graph, plan, steps=STEPS, device="cuda", seed=1,
                           mode=RunMode(arena=True, placed=False))
        _equal(placed, plain, f"{name} in an arena", graph)


def test_graph_replay_is_bitwise_eager_replay(arena_plans):
    # every kernel of the test models captures (Dropout too: its mask is copied from the
    # host); run_steps raises an ExecutionError naming the kernel where a capture fails
    graph, plans = arena_plans
    for name, plan in plans.items():
        eager = run_steps(graph, plan, steps=STEPS, device="cuda", seed=2,
                          mode=RunMode(arena=True, placed=False))
        replayed = run_steps(graph, plan, steps=STEPS, device="cuda", seed=2,
                             mode=RunMode(arena=True, placed=False, replay=True))
        _equal(replayed, eager, f"{name} replayed as a CUDA graph", graph)
        # captured without the arena: outputs from the graph's pool, static inputs only
        pooled = run_steps(graph, plan, steps=STEPS, device="cuda", seed=2,
                           mode=RunMode(placed=False, replay=True))
        _equal(pooled, eager, f"{name} replayed as a CUDA graph with static inputs", graph)


def test_uncapped_graph_replay_copies_no_output_into_a_slot():
    """An uncapped replay without an arena captures with static inputs: the only
    copies per iteration are the carried values (weights) written back into their buffers."""
    from autotm_py import api
    graph = _graph("cnn")
    plan = _arena_plans(graph)["async-arena"]
    pooled = api.execute(graph, plan, device="cuda", mode=RunMode(placed=False, replay=True),
                         iterations=2, warmup=1, capped=False)
    placed = api.execute(graph, plan, device="cuda",
                         mode=RunMode(arena=True, placed=False, replay=True),
                         iterations=2, warmup=1, capped=False)
    assert pooled.replayed and placed.replayed, (pooled.notes, placed.notes)
    assert pooled.arena_bytes is None and placed.arena_bytes is not None
    assert pooled.copied_outputs <= len(graph.carried) < placed.copied_outputs


def test_blas_workspaces_of_other_streams_are_released():
    """A stream that ran a matmul keeps its cuBLAS workspace until `release_blas_workspaces`
    (an earlier run's, or the eager warm-up's once a graph is captured on another stream, would
    count against the cap); `prime_blas_workspaces` leaves only the current stream's."""
    from autotm_py.runtime.device import prime_blas_workspaces, release_blas_workspaces
    a = torch.ones(64, 64, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.mm(a, a)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    prime_blas_workspaces("cuda")
    primed = torch.cuda.memory_allocated()
    release_blas_workspaces("cuda")
    released = torch.cuda.memory_allocated()
    assert released < primed < held + (1 << 20), (held, primed, released)


def test_conv_writes_into_its_slot_on_cuda():
    graph = _graph("cnn")
    values = {t: v.cuda() for t, v in init_values(graph, seed=4).items()}
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    for conv in (k for k in graph.kernels if k.op_type == "Conv"):
        args = [values.get(t, torch.randn(graph.tensors[t].shape, device="cuda"))
                for t in conv.inputs]
        out = torch.empty(graph.tensors[conv.outputs[0]].shape, device="cuda")
        address = out.data_ptr()
        assert run_kernel_into(conv, args, [out]), conv.name
        assert out.data_ptr() == address
        assert torch.equal(out, run_kernel(conv, args)[0]), conv.name


def test_linear_and_batch_norm_direct_paths_on_cuda():
    """Linear, LinearGrad and the training batch norm (cuDNN's pair here) write into their
    slots what their kernels return, allocating nothing, as the planner's `writes_in_place`
    assumes."""
    from autotm_py.frontend.fuse import fuse_graph
    from autotm_py.ir.training import derive_training
    from autotm_py.kernels import batch_norm
    from autotm_py.memory.scratch import writes_in_place
    from autotm_py.runtime.reference import run_graph
    from tests.test_training_models import small_cnn, tiny_decoder

    for forward in (tiny_decoder(), small_cnn()):
        graph = derive_training(fuse_graph(forward), optimizer="sgd")
        start = {t: v.cuda() for t, v in init_values(graph, seed=4).items()}
        values = {**start, **run_graph(graph, start, keep=range(len(graph.tensors)))}
        for kernel in graph.kernels:
            if kernel.op_type not in ("Linear", "LinearGrad", "BatchNormalization"):
                continue
            args = [values[t] for t in kernel.inputs]
            outs = [torch.empty(graph.tensors[t].shape, device="cuda") for t in kernel.outputs]
            torch.cuda.synchronize()
            held = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            written = run_kernel_into(kernel, args, outs)
            assert written == writes_in_place(graph, kernel), kernel.name
            if kernel.op_type == "BatchNormalization":
                eps = float(kernel.attr("epsilon", 1e-5))
                assert written and batch_norm.cudnn_batch_norm(args[0], args[1], eps)
                assert torch.cuda.max_memory_allocated() - held < 4096, kernel.name
            if written:
                for got, want in zip(outs, run_kernel(kernel, args), strict=True):
                    assert torch.equal(got, want), kernel.name


def test_arena_run_in_eager_mode_hides_no_synchronization(arena_plans):
    graph, plans = arena_plans
    run_without_synchronizing(graph, plans, ("async-arena", "offload", "all-slow"), arena=True)


@pytest.mark.parametrize("replay", [False, True])
def test_planned_addresses_fit_the_budget_without_retries(replay):
    # In a process of its own, as `autotm run` is (in_own_process says why)
    for run in in_own_process("tests.test_arena_gpu", "fit_runs", replay):
        assert run["plan_arena"], run
        assert run["alloc_retries"] == 0, run
        assert run["replayed"] is replay, run
        assert run["arena_bytes"] == run["scratch_offset"], run
        assert run["reserved_peak_bytes"] is not None and run["cap_bytes"] is not None, run
        assert run["reserved_peak_bytes"] <= run["cap_bytes"], run
        # within the cap (budget + 64 MiB slack): the test costs know no real cuDNN workspace
        assert run["peak_fast_bytes"] <= run["cap_bytes"], run
        # a capture may hold more, once, up to the allowance (drivers.CAPTURE_ALLOWANCE)
        if replay:
            assert run["capture_reserved_bytes"] is not None, run
            assert run["capture_reserved_bytes"] <= run["cap_bytes"] + CAPTURE_ALLOWANCE, run


def fit_runs(replay: bool, placed: bool = False) -> list[dict]:
    """Plan the test CNN at planned addresses (sync and async) between its working set and its
    peak, with the preset's real runtime reserve (torch's cuBLAS workspaces, as users plan), and
    run each plan on the GPU (`placed`: with the placed allocator): what the run reports."""
    graph = _graph("cnn")
    costs = costs_for(graph)
    reserve = preset("h100-pcie5").runtime_reserve_bytes
    probe = machine_for(graph, PlanConfig(fast_mem_bytes=1 << 30, device="cuda",
                                          run=RunMode(arena=True)), costs)
    budget = reserve + probe.scratch_reserve + \
        (graph.max_working_set[0] + graph.peak_live_bytes) // 2
    runs = []
    for strategy in ("sync", "async"):
        result = optimize(graph, PlanConfig(fast_mem_bytes=budget, device="cuda",
                                            strategy=strategy,
                                            run=RunMode(arena=True, replay=replay)),
                          costs=costs)
        if result.plan is None or result.plan.arena is None:
            runs.append({"strategy": strategy, "plan_arena": False, "message": result.message})
            continue
        run = execute(graph, result.plan, device="cuda",
                      mode=RunMode(arena=True, placed=placed, replay=replay),
                      measure=Measure(iterations=3, warmup=1, device_busy=replay))
        runs.append({"strategy": strategy, "plan_arena": True,
                     "scratch_offset": result.plan.arena.scratch_offset,
                     **{k: getattr(run, k) for k in (
                         "alloc_retries", "replayed", "arena_bytes", "reserved_peak_bytes",
                         "cap_bytes", "peak_fast_bytes", "capture_reserved_bytes", "notes",
                         "placed_outputs", "device_busy_s", "device_span_s",
                         "device_kernel_s")}})
    return runs


def test_capped_replay_with_static_inputs_stays_under_the_cap():
    """A plan without an arena replays under its cap with static inputs (the graph's private
    pool on torch's allocator holds the iteration): captured within the cap itself (no
    allowance), reserved peak within the cap, no allocator retries, nothing copied into slots
    but the carried values."""
    for run in in_own_process("tests.test_arena_gpu", "static_runs"):
        assert run["replayed"] and run["arena_bytes"] is None, run
        assert run["alloc_retries"] == 0, run
        assert run["reserved_peak_bytes"] <= run["cap_bytes"], run
        assert run["capture_reserved_bytes"] <= run["cap_bytes"], run
        assert run["copied_outputs"] <= run["carried"], run


def static_runs() -> list[dict]:
    """The test CNN planned for replay without an arena between its working set and its peak
    (headroom 0: the cap's 64 MiB of slack dwarfs its KiB-sized tensors), run capped and
    replayed through `api.execute`: what the run reports."""
    from autotm_py import api
    graph = _graph("cnn")
    costs = costs_for(graph)
    reserve = preset("h100-pcie5").runtime_reserve_bytes
    budget = reserve + (graph.max_working_set[0] + graph.peak_live_bytes) // 2
    runs = []
    for strategy in ("sync", "async"):
        result = optimize(graph, PlanConfig(fast_mem_bytes=budget, device="cuda",
                                            strategy=strategy, run=RunMode(replay=True)),
                          costs=costs)
        assert result.plan is not None and result.plan.arena is None, result.message
        run = api.execute(graph, result.plan, device="cuda",
                          mode=RunMode(placed=False, replay=True), iterations=3, warmup=1)
        runs.append({"strategy": strategy, "carried": len(graph.carried),
                     **{k: getattr(run, k) for k in (
                         "alloc_retries", "replayed", "arena_bytes", "reserved_peak_bytes",
                         "cap_bytes", "capture_reserved_bytes", "copied_outputs", "notes")}})
    return runs


def test_executors_leave_no_memory_behind_for_the_next_run():
    """Runs one after another in one process (a sweep) start from the same allocated bytes:
    every executor captures on the same stream, so cuBLAS's per-stream workspace is made once
    (a new stream per executor left one more workspace after every graph run)."""
    graph = _graph("decoder")  # matmuls: cuBLAS runs on the capture stream
    plan = with_arena(graph, _arena_plans(graph)["all-fast"], costs_for(graph))
    after = []
    for _ in range(3):
        execute(graph, plan, device="cuda", mode=RunMode(placed=False, replay=True),
                measure=Measure(iterations=2, warmup=1, capped=False))
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        after.append(torch.cuda.memory_allocated())
    assert after[1] == after[2] == after[0], after


def test_a_cap_starts_without_the_garbage_of_an_earlier_run():
    """A block kept only by a reference cycle (as an earlier run's graph or arena can be) is
    collected when the next run applies its cap, instead of counting against it."""
    import gc

    from autotm_py.runtime.device import apply_cap, release_cap

    class Holder:
        pass

    gc.collect()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    gc.disable()  # no automatic collection: only apply_cap's
    try:
        first, second = Holder(), Holder()
        first.other, second.other = second, first
        first.block = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        del first, second
        apply_cap(before + (128 << 20), "cuda:0", True, 0)
        try:
            torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # fits without the garbage
        finally:
            release_cap("cuda:0")
    finally:
        gc.enable()


def _synchronizing(kernel_fn):
    """`kernel_fn` (a registry kernel) preceded, on CUDA, by a host synchronization, which a
    CUDA-graph capture does not allow: a capture fails at it."""
    def synchronizing(kernel, args):
        if args[0].is_cuda:
            args[0].sum().item()
        return kernel_fn(kernel, args)
    return synchronizing


def test_a_failed_capture_leaves_nothing_allocated(monkeypatch):
    """The partial iteration of a capture that failed (here at a kernel that synchronizes,
    after every tensor before it was allocated in the graph's pool) is let go at once: the
    eager iterations that follow start from the bytes allocated before the capture."""
    from autotm_py.runtime.execute import new_executor

    graph = _graph("decoder")
    plan = _arena_plans(graph)["all-fast"]
    monkeypatch.setitem(KERNELS, "Erf", _synchronizing(KERNELS["Erf"]))
    _, executor, driver = new_executor(graph, plan, "cuda", mode=RunMode(replay=True))
    driver.warm_up()
    executor.prepare()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    assert "Erf" in (driver.capture() or "")
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= before


def test_a_failed_run_gives_its_memory_back(monkeypatch):
    """A run that fails (here a kernel runs out of memory in the second iteration) drops what
    it held before the error leaves `execute`: the caller's traceback keeps the executor alive,
    and its tensors counted against the next run's cap."""
    from autotm_py.errors import ExecutionError

    graph = _graph("decoder")
    plan = _arena_plans(graph)["all-fast"]
    erf, calls = KERNELS["Erf"], []

    def failing_erf(kernel, args):
        calls.append(1)
        if len(calls) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 MiB")
        return erf(kernel, args)

    # a run that succeeds first: the library workspaces it makes (cuBLAS's, per stream) stay
    execute(graph, plan, device="cuda", measure=Measure(iterations=1, warmup=1, capped=False))
    monkeypatch.setitem(KERNELS, "Erf", failing_erf)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with pytest.raises(ExecutionError, match="out of fast memory") as failed:
        execute(graph, plan, device="cuda", measure=Measure(iterations=2, warmup=1, capped=False))
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= before, failed.value


def test_a_capture_that_runs_out_of_memory_gives_its_pool_back(monkeypatch):
    """A capture that runs out of memory (a capped replay with static inputs whose plan left
    too little headroom) falls back to eager iterations, and its private pool goes back to the
    driver: on the H100 the allocator had been left believing a capture was under way, so that
    neither `empty_cache` nor its own retries gave anything back and every later capped run of
    the process ran out of memory. (The eager iterations may leave a library workspace of
    their own in the default pool.) This passes with and without `_cuda_endAllocateToPool` in
    `drivers._release_pool` on the H100: the one-process sweep of recompute_check.py, not this
    test, showed that fault (experiments/journal/gpu-2026-11.md)."""
    graph = _graph("decoder")
    plan = _arena_plans(graph)["all-fast"]
    erf = KERNELS["Erf"]

    def greedy_erf(kernel, args):
        if torch.cuda.is_current_stream_capturing():  # over the cap set below: out of memory
            torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        return erf(kernel, args)

    monkeypatch.setitem(KERNELS, "Erf", greedy_erf)
    total = torch.cuda.get_device_properties(0).total_memory
    reserved = []
    try:
        for _ in range(3):
            # the allocator meets a cap (as under a budget) and tries to free and retry inside
            # the capture, which ends the capture with an error
            torch.cuda.set_per_process_memory_fraction(
                (torch.cuda.memory_reserved() + (512 << 20)) / total)
            run = execute(graph, plan, device="cuda", mode=RunMode(placed=False, replay=True),
                          measure=Measure(iterations=1, warmup=1, capped=False))
            assert not run.replayed and any("out of memory" in n.lower() for n in run.notes), \
                run.notes
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            reserved.append(torch.cuda.memory_reserved())
            pools = {tuple(seg["segment_pool_id"])
                     for seg in torch.cuda.memory._snapshot()["segments"]}
            assert pools <= {(0, 0)}, pools  # no private pool left
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert reserved[2] <= reserved[1], reserved  # nothing grows from one failure to the next


def test_a_kernel_that_cannot_be_captured_is_named(monkeypatch):
    graph = _graph("decoder")
    plan = with_arena(graph, _arena_plans(graph)["all-fast"], costs_for(graph))
    assert "Erf" not in INTO  # the kernel runs through the registry
    monkeypatch.setitem(KERNELS, "Erf", _synchronizing(KERNELS["Erf"]))
    reserved = []
    for _ in range(2):
        run = execute(graph, plan, device="cuda", mode=RunMode(placed=False, replay=True),
                      measure=Measure(iterations=2, warmup=1, capped=False))
        assert not run.replayed
        note = next(n for n in run.notes if n.startswith("no CUDA graph"))
        assert "Erf" in note, note
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        reserved.append(torch.cuda.memory_reserved())
    # a failed capture gives its private pool back (torch kept it for the whole process, and a
    # sweep's later rows ran out of memory under their caps) ...
    assert reserved[1] == reserved[0], reserved
    # ... and leaves the default generator out of capture mode (torch leaves it in, and every
    # later random op of the process failed)
    torch.rand(4, device="cuda")
    torch.nn.functional.dropout(torch.ones(8, device="cuda"), 0.5)
