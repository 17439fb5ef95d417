"""The placed allocator's bookkeeping (`runtime.placed`, the C shim), driven over made-up
addresses without a GPU, and the executor's use of it (which slots it offers, and that
results do not depend on where kernels put their outputs). tests/test_placed_gpu.py runs it
as torch's allocator on the device machine."""

from __future__ import annotations

import pytest
import torch

from autotm_py.options import Measure, RunMode
from autotm_py.runtime import placed
from autotm_py.runtime.execute import run_steps
from autotm_py.runtime.reference import train_steps
from tests.test_executor import _arena_plans, _graph

ARENA = RunMode(arena=True)
ONE = Measure(iterations=1, warmup=1)

BASE = 1 << 40  # made-up addresses: the shim never touches the memory it hands out
MIB = 1 << 20


@pytest.fixture()
def lib(tmp_path):
    shim = placed.PlacedLib(placed.build(tmp_path))
    shim.use_region(BASE, 64 * MIB)
    return shim


def test_region_is_first_fit_aligned_and_merges_what_is_freed(lib):
    a, b, c = lib.alloc(1000), lib.alloc(3 * MIB), lib.alloc(10)
    assert (a, b, c) == (BASE, BASE + 1024, BASE + 1024 + 3 * MIB)
    lib.free(b, 3 * MIB)
    assert lib.alloc(2 * MIB) == b  # the first hole that fits
    lib.free(b, 2 * MIB)
    lib.free(a, 1000)
    lib.free(c, 10)
    s = lib.stats()
    assert s.in_use_bytes == 0 and s.peak_in_use_bytes == 1024 + 3 * MIB + 512
    assert s.peak_extent_bytes == 1024 + 3 * MIB + 512
    assert lib.alloc(64 * MIB) == BASE  # everything merged back into one extent
    assert lib.alloc(1) == 0  # no room, and no CUDA here to overflow to


def test_an_expected_slot_goes_to_the_first_allocation_of_its_size(lib):
    lead = 512  # the arena starts past its allocation's address (runtime.arena.LEAD_BYTES)
    base = lib.alloc(lead + 8 * MIB)
    arena = base + lead
    lib.set_arena(arena, 8 * MIB)
    slot = arena + MIB
    with lib.expecting([(slot, 4096), (arena - 512, 512), (arena + 8 * MIB, 512)]) as armed:
        assert armed == 1  # addresses outside the arena are never offered
        other = lib.alloc(4000)
        assert other != slot
        assert lib.alloc(4096) == slot
        lib.free(slot, 4096)  # a temporary freed inside the kernel: offered again
        assert lib.alloc(4096) == slot
        assert lib.alloc(4096) not in (slot, 0)  # once handed out, not twice
    assert lib.alloc(4096) != slot  # cleared after the kernel
    before = lib.stats().in_use_bytes
    lib.free(slot, 4096)  # a slot's bytes stay the arena's
    assert lib.stats().in_use_bytes == before
    assert lib.stats().placed == 2
    lib.free(base, lead + 8 * MIB)  # the arena's allocation goes back to the region
    assert lib.stats().in_use_bytes == before - lead - 8 * MIB
    with lib.expecting([(arena, 4096)]) as armed:
        assert armed == 0  # no arena any more


def test_the_fence_keeps_new_allocations_above_what_a_graph_uses(lib):
    low, _ = lib.alloc(MIB), lib.alloc(MIB)
    lib.reset_peaks()  # as before a capture
    scratch = lib.alloc(4 * MIB)  # what the captured kernels wrote, freed by the capture's end
    lib.free(scratch, 4 * MIB)
    lib.free(low, MIB)
    lib.fence(True)
    assert lib.alloc(MIB) == scratch + 4 * MIB  # neither the hole below nor the graph's scratch
    lib.reset_peaks()  # the replays' peak still counts the graph's extent
    assert lib.stats().peak_extent_bytes == 7 * MIB
    lib.fence(False)
    assert lib.alloc(MIB) == low
    lib.reset_peaks()
    assert lib.stats().peak_extent_bytes == 7 * MIB  # what is still allocated


def test_the_planner_and_the_shim_agree_on_their_shared_sizes():
    # machine.WINDOW_MIN_BYTES (kernels with less scratch get no window) must be the shim's
    # WINDOW_MIN (requests under it skip windows), and placed.MAX_MISSES its table's length
    import re

    from autotm_py.machine import WINDOW_MIN_BYTES

    source = placed.SOURCE.read_text()
    window_min = re.search(r"#define WINDOW_MIN \((\d+)u << (\d+)\)", source)
    assert window_min is not None
    assert int(window_min[1]) << int(window_min[2]) == WINDOW_MIN_BYTES
    assert f"#define MAX_MISSES {placed.MAX_MISSES}\n" in source


def test_a_scratch_window_serves_what_is_not_a_slot_and_reports_what_outlives_it(lib):
    lead = 512
    base = lib.alloc(lead + 16 * MIB)
    arena = base + lead
    lib.set_arena(arena, 16 * MIB)
    window = arena + 2 * MIB
    slot = arena + 10 * MIB
    with lib.expecting([(slot, 4096)]), lib.window(window, 4 * MIB) as use:
        assert use.opened
        small = lib.alloc(1000)  # small requests leave the window to the large ones
        assert not window <= small < window + 4 * MIB
        workspace = lib.alloc(2 * MIB)
        assert workspace == window  # first fit in the window
        assert lib.alloc(4096) == slot  # slots still come first
        temp = lib.alloc(MIB)
        assert temp == window + 2 * MIB
        beyond = lib.alloc(3 * MIB // 2)  # no room left in the window: from the region
        assert not window <= beyond < window + 4 * MIB and beyond != 0
        lib.free(workspace, 2 * MIB)
        assert lib.alloc(MIB) == window  # freed window bytes are reused
        lib.free(window, MIB)
        for start, nbytes in ((temp, MIB), (beyond, 3 * MIB // 2), (small, 1000)):
            lib.free(start, nbytes)
    assert (use.spilled_bytes, use.largest_spill) == (3 * MIB // 2, 3 * MIB // 2)
    assert lib.stats().windowed == 3
    assert lib.stats().in_use_bytes == lead + 16 * MIB  # window bytes are not region bytes
    with lib.window(arena + 16 * MIB - 512, MIB) as use:
        assert not use.opened  # a window must lie inside the arena
    with pytest.raises(placed.WindowLeak, match="1 allocation"), lib.window(window, 4 * MIB):
        lib.alloc(MIB)  # never freed: its bytes hold tensors once the kernel is done
    assert lib.alloc(MIB) != window  # closed: nothing is served from it any more


def test_requests_beyond_the_region_are_kept_with_their_tags_largest_first(lib):
    lib.tag(7)
    assert lib.alloc(64 * MIB) == BASE
    assert lib.alloc(MIB) == 0  # nothing left, and no CUDA here
    assert lib.alloc(3 * MIB) == 0
    lib.tag(9)
    assert lib.alloc(2 * MIB) == 0
    lib.tag(-1)
    assert lib.alloc(512) == 0
    assert lib.misses() == [(7, 3 * MIB), (9, 2 * MIB), (-1, 512)]  # one entry per tag
    assert lib.misses() == []  # read once


def test_overflow_is_kept_while_a_graph_may_use_it_and_freed_when_the_last_hold_goes(lib):
    # A capture in CUDA's global mode forbids cudaMalloc and cudaFree on every thread (the
    # LSTM's chunked gradient, whose backward autograd runs on its own thread, overflowed the
    # region during a capture, 2026-12-06): while a graph is held, overflow is allocated in
    # relaxed mode (here: two counted switches) and its frees wait for the last hold to go.
    switches = lib.use_host_overflow()
    assert lib.alloc(64 * MIB) == BASE
    first = lib.alloc(MIB)  # beyond the region: from the (here: host) heap
    assert first and lib.stats().overflow_bytes == MIB
    lib.free(first, MIB)  # no graph: freed at once, and no capture-mode switch
    assert lib.stats().overflow_bytes == 0 and lib.use_host_overflow() == switches
    assert lib.hold_overflow(True) == 0  # a capture begins
    during = lib.alloc(2 * MIB)
    assert during and lib.use_host_overflow() == switches + 2  # relaxed, then back
    lib.free(during, 2 * MIB)  # the graph's replays may write it: kept
    assert lib.stats().overflow_bytes == 2 * MIB
    assert lib.hold_overflow(True) == 1  # a second graph is captured
    assert lib.hold_overflow(False) == 1  # the first is gone: the second still holds
    assert lib.stats().overflow_bytes == 2 * MIB
    assert lib.hold_overflow(False) == 0  # none left: the waiting free happens
    assert lib.stats().overflow_bytes == 0
    assert lib.hold_overflow(False) == 0  # an unmatched release holds nothing


def test_build_names_a_missing_compiler(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(OSError, match="could not build the placed allocator"):
        placed.build(tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*.so"))  # nothing half-written left


def test_install_can_be_switched_off(monkeypatch):
    monkeypatch.setenv(placed.ENV_OFF, "0")
    assert placed.install(None) == f"{placed.ENV_OFF}=0"
    assert placed.active() is None


class _Recorder:
    """Stands in for the shim on the CPU: records the slots offered per kernel (torch's CPU
    allocator puts the outputs elsewhere, so the executor copies them, as without it)."""

    def __init__(self) -> None:
        self.offered: list[list[tuple[int, int]]] = []
        self.fenced: list[bool] = []
        self.windows: list[tuple[int, int]] = []
        self.tags: list[int] = []
        self.missed: list[tuple[int, int]] = []

    def set_arena(self, start: int, nbytes: int) -> None:
        self.arena = (start, nbytes)

    def expecting(self, slots):
        import contextlib
        self.offered.append(list(slots))
        return contextlib.nullcontext(len(slots))

    def fence(self, on: bool) -> None:
        self.fenced.append(on)

    def tag(self, record: int) -> None:
        self.tags.append(record)

    def misses(self):
        return self.missed

    def window(self, start: int, nbytes: int):
        import contextlib
        self.windows.append((start, nbytes))
        return contextlib.nullcontext(placed.WindowUse(True))


@pytest.mark.parametrize("name", ["cnn", "decoder-fused"])
def test_the_executor_offers_slots_and_keeps_the_results(name, monkeypatch):
    graph = _graph(name)
    recorder = _Recorder()
    monkeypatch.setattr(placed, "active", lambda: recorder)
    reference = train_steps(graph, steps=2, seed=3)
    plan = _arena_plans(graph)["async-arena"]
    steps = run_steps(graph, plan, steps=2, seed=3, mode=ARENA)
    for got, want in zip(steps, reference, strict=True):
        for tid in graph.outputs:
            assert torch.equal(got[tid], want[tid].cpu()), graph.name_of(tid)
    start, nbytes = recorder.arena
    offered = [slot for kernel in recorder.offered for slot in kernel]
    assert offered, "no kernel without an out= form was offered its slots"
    assert all(start <= s and s + n <= start + nbytes for s, n in offered)
    assert recorder.fenced[-1] is False  # the run lifts any fence as it ends


def _windowed_plan(graph):
    from dataclasses import replace

    from autotm_py.config import PlanConfig
    from autotm_py.machine import WINDOW_SLACK_BYTES
    from autotm_py.pipeline import machine_for, optimize
    from tests.graphs import costs_for

    # every third kernel with 1.5 MiB of workspace, which gets a window (the rest ask for KiB,
    # which the placed allocator serves from the region); the budget half-way between the
    # working set and the peak, with room for a window and its slack
    workspace = 3 * MIB // 2
    costs = costs_for(graph)
    costs = replace(costs, workspace_bytes=tuple(workspace if i % 3 == 0 else 0
                                                 for i in range(len(graph.kernels))))
    budget = (graph.max_working_set[0] + graph.peak_live_bytes) // 2 + \
        2 * (workspace + WINDOW_SLACK_BYTES)
    config = PlanConfig(fast_mem_bytes=budget, device="cuda", strategy="async",
                        run=RunMode(arena=True, scratch="windows"))
    result = optimize(graph, config, costs=costs)
    assert result.plan is not None and result.plan.arena is not None, result.message
    return result.plan, machine_for(graph, config, costs)


@pytest.mark.parametrize("name", ["cnn", "decoder-fused"])
def test_the_executor_opens_each_kernels_scratch_window_and_keeps_the_results(name,
                                                                              monkeypatch):
    from autotm_py.plan import Compute, Recompute

    graph = _graph(name)
    recorder = _Recorder()
    monkeypatch.setattr(placed, "active", lambda: recorder)
    reference = train_steps(graph, steps=2, seed=3)
    plan, machine = _windowed_plan(graph)
    steps = run_steps(graph, plan, steps=2, seed=3, mode=ARENA)
    for got, want in zip(steps, reference, strict=True):
        for tid in graph.outputs:
            assert torch.equal(got[tid], want[tid].cpu()), graph.name_of(tid)
    start, _ = recorder.arena
    layout = plan.arena
    planned = [(start + b.offset, b.nbytes) for _, b in sorted(layout.windows().items())]
    kernels = [r for r in plan.records if isinstance(r, Compute | Recompute)
               and machine.windows[r.kernel]]
    assert len(planned) == len(kernels) > 0  # windows only for scratch of 1 MiB or more
    # every step (a warm-up and the timed ones run the same records) opens them in order
    assert recorder.windows[:len(planned)] == planned
    assert len(recorder.windows) % len(planned) == 0


def test_a_kernel_waits_for_copies_out_of_freed_tensors_under_its_window(monkeypatch):
    """The compute stream joins the copy out of a freed tensor whose bytes a window reuses
    before the kernel may write there (as `_claim` does for a slot's next tenant); copies out
    of bytes elsewhere are left alone."""
    from autotm_py.runtime.executor import Executor

    graph = _graph("cnn")
    monkeypatch.setattr(placed, "active", lambda: _Recorder())
    plan, _ = _windowed_plan(graph)
    joined: list[tuple[int, str]] = []
    compute = Executor.compute

    def compute_with_copies_out(self, record):
        window = self.memory.arena.window(self.index)
        if window is not None:  # a copy out of these bytes, and one out of a tensor elsewhere
            elsewhere = torch.empty(4, dtype=torch.uint8)
            self.state.busy += [(window[:8], f"under #{self.index}"), (elsewhere, "elsewhere")]
        compute(self, record)

    def join(self, event):
        joined.append((self.index, event))
        self.state.joined.add(event)

    monkeypatch.setattr(Executor, "compute", compute_with_copies_out)
    monkeypatch.setattr(Executor, "_join", join)
    run_steps(graph, plan, steps=1, seed=3, mode=ARENA)
    assert joined and all(event == f"under #{index}" for index, event in joined)


def test_an_allocation_that_outlives_its_window_stops_the_run(monkeypatch):
    import contextlib

    from autotm_py.errors import ExecutionError

    class Leaky(_Recorder):
        @contextlib.contextmanager
        def window(self, start, nbytes):
            yield placed.WindowUse(True)
            raise placed.WindowLeak("1 allocation(s) made in a scratch window outlived "
                                    "their kernel")

    graph = _graph("cnn")
    monkeypatch.setattr(placed, "active", lambda: Leaky())
    plan, _ = _windowed_plan(graph)
    with pytest.raises(ExecutionError, match=r"kernel '.+': 1 allocation\(s\) made in a "
                                             r"scratch window outlived their kernel"):
        run_steps(graph, plan, steps=1, seed=3, mode=ARENA)


def test_a_run_names_the_kernels_whose_scratch_did_not_fit_their_windows(monkeypatch):
    import contextlib

    from autotm_py.runtime.execute import execute

    class Spilling(_Recorder):
        @contextlib.contextmanager
        def window(self, start, nbytes):
            use = placed.WindowUse(True)
            yield use
            use.spilled_bytes = use.largest_spill = nbytes + 3 * MIB  # more than it holds

    from autotm_py.plan import Compute, Recompute

    graph = _graph("cnn")
    spilling = Spilling()
    monkeypatch.setattr(placed, "active", lambda: spilling)
    plan, _ = _windowed_plan(graph)
    first = next(i for i, r in enumerate(plan.records) if isinstance(r, Compute))
    spilling.missed = [(first, 98 * MIB), (-1, MIB)]
    result = execute(graph, plan, device="cpu", mode=ARENA, measure=ONE)
    (note,) = [n for n in result.notes if n.startswith("scratch beyond its window")]
    assert "largest requests: '" in note and "profile on this GPU" in note
    name = graph.kernels[plan.records[first].kernel].name
    assert f"98.0 MiB at {name!r} (record #{first}), 1.0 MiB between kernels" in \
        next(n for n in result.notes if n.startswith("requests beyond the cap"))
    computes = {i for i, r in enumerate(plan.records) if isinstance(r, Compute | Recompute)}
    assert computes <= set(spilling.tags) and -1 in spilling.tags  # every record is named
    monkeypatch.setattr(placed, "active", lambda: _Recorder())  # every request fitted
    result = execute(graph, plan, device="cpu", mode=ARENA, measure=ONE)
    assert not any(n.startswith("scratch beyond") for n in result.notes)


def test_the_gpu_test_digests_every_output():
    # tests/test_placed_gpu.py compares these digests between processes on the GPU
    from tests.test_placed_gpu import digests
    got = digests("cnn", False, device="cpu")
    assert not got["installed"]
    assert got["digests"] and all(len(steps) == 3 for steps in got["digests"].values())


def test_the_run_installs_it_for_arena_runs_on_cuda_with_the_cap_as_region(monkeypatch):
    from autotm_py import api
    from autotm_py.cli.run import run_cmd
    from autotm_py.options import CAP_SLACK_BYTES

    asked: list[int | None] = []

    def install(region):
        asked.append(region)
        return "no GPU in this test"

    monkeypatch.setattr(placed, "install", install)
    graph = _graph("cnn")
    plan = _arena_plans(graph)["async-arena"]
    budget = plan.header.budget_bytes
    monkeypatch.setattr("autotm_py.runtime.device.use_replay_work_queues", lambda: None)
    monkeypatch.setattr("autotm_py.runtime.device.check_device", lambda device: device)
    notes = api.prepare_cuda_process(plan, "cuda", ARENA)
    assert notes == ["outputs copied into their slots: no placed allocator (no GPU in this test)"]
    assert asked == [budget + CAP_SLACK_BYTES]
    api.prepare_cuda_process(plan, "cuda", RunMode(replay=True))  # a capped replay: its arena
    api.prepare_cuda_process(plan, "cuda", ARENA, capped=False)
    assert asked[1:] == [budget + CAP_SLACK_BYTES, None]  # uncapped: the device's free memory
    api.prepare_cuda_process(plan, "cuda", RunMode())  # eager on the caching allocator
    api.prepare_cuda_process(plan, "cuda", RunMode(arena=True, placed=False))  # --no-placed
    api.prepare_cuda_process(plan, "cpu", ARENA)
    assert len(asked) == 3
    (option,) = [p for p in run_cmd.params if p.name == "placed"]
    assert option.default is None and "--no-placed" in option.secondary_opts  # the plan's


def test_plans_for_the_placed_allocator_leave_placed_outputs_out_of_scratch():
    from autotm_py.config import PlanConfig
    from autotm_py.memory.scratch import PLACED_OPS, allocated_outputs
    from autotm_py.pipeline import machine_for, machine_for_plan, optimize
    from tests.graphs import costs_for

    graph = _graph("cnn")
    costs = costs_for(graph)
    carried_ends = {last for _, last in graph.carried}
    for kernel in graph.kernels:
        copied, placed_ = (allocated_outputs(graph, kernel, p) for p in (False, True))
        if kernel.op_type in PLACED_OPS:
            assert placed_ == [t for t in copied if t in carried_ends], kernel.name
        else:
            assert placed_ == copied, kernel.name
    budget = (graph.max_working_set[0] + graph.peak_live_bytes) // 2
    config = {"fast_mem_bytes": budget, "device": "cuda", "strategy": "async"}
    machines = {p: machine_for(graph, PlanConfig(**config, run=RunMode(True, placed=bool(p))),
                               costs) for p in (0, 1)}
    assert machines[1].scratch_reserve < machines[0].scratch_reserve  # ConvGrad's outputs
    assert machines[1].scratch.sum() < machines[0].scratch.sum()
    for placed_ in (False, True):
        plan = optimize(graph, PlanConfig(**config, run=RunMode(True, placed=placed_)),
                        costs=costs).plan
        assert plan is not None and plan.arena is not None
        assert plan.header.run.placed is placed_
        assert machine_for_plan(graph, plan, costs).places_outputs is placed_


def test_run_summary_counts_placed_outputs_and_names_overflow(capsys):
    from autotm_py.cli.run import _print_summary
    from autotm_py.runtime.execute import RunResult

    result = RunResult(
        device="cuda", device_name="GPU", iterations=1, warmup=0, iteration_times_s=(0.1,),
        median_s=0.1, kernel_times_s=None, peak_fast_bytes=1, modelled_peak_fast_bytes=1,
        budget_bytes=2, cap_bytes=3, predicted_time_s=None, slow_pool_bytes=0, strategy="s",
        model_name="m", host_median_s=0.01, alloc_retries=2, arena_bytes=1, copied_outputs=5,
        placed_outputs=7,
        notes=("the plan was made for kernels allocating their outputs at their slots",))
    _print_summary(result, {"estimated_kernels": 0, "kernels": 1, "weights": "seeded"})
    out = capsys.readouterr().out
    assert "5 outputs per iteration copied into their slots, 7 allocated there" in out
    assert "note: the plan was made for kernels allocating" in out
    assert "could not serve" in out and "--no-placed" in out and "--headroom" not in out
