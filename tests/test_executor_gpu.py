"""The executor on a CUDA GPU (marked `gpu`: run on the device machine with
`python -m pytest -m gpu`). Plans that move data compute bitwise what the all-fast plan
computes, copies issue no hidden host synchronization, and the measured peak stays within the
plan's budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autotm_py.memory.tiers import preset
from autotm_py.options import Measure, RunMode
from autotm_py.runtime.execute import compose, execute, run_steps
from autotm_py.runtime.executor import Executor
from autotm_py.runtime.reference import init_values
from tests.test_executor import _graph, _plans

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]


def in_own_process(module: str, function: str, *args) -> object:
    """`module.function(*args)` run in a fresh Python process (as `autotm run` is), its JSON
    result. For tests of the process's whole memory: in this one, the streams of every earlier
    test's executors hold cuBLAS workspaces (never freed) that count against a cap."""
    script = (f"import json; from {module} import {function}; "
              f"print(json.dumps({function}(*{args!r})))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def cnn():
    graph = _graph("cnn")
    return graph, _plans(graph)


def test_plans_are_bitwise_equal_on_cuda(cnn):
    graph, plans = cnn
    reference = run_steps(graph, plans["all-fast"], steps=3, device="cuda", seed=1)
    for name, plan in plans.items():
        got = run_steps(graph, plan, steps=3, device="cuda", seed=1)
        for step, (a, b) in enumerate(zip(got, reference, strict=True)):
            for tid in graph.outputs:
                assert torch.equal(a[tid], b[tid]), f"{name} step {step} {graph.name_of(tid)}"


def run_without_synchronizing(graph, plans, names, *, arena: bool = False) -> None:
    """Run one iteration of each named plan (those present) with torch's sync debug mode set
    to raise: any host synchronization inside the timed iteration fails the test."""
    masters = {t: v.cpu() for t, v in init_values(graph, seed=0).items()}
    for name in names:
        if name not in plans:
            continue
        ex, _ = compose(graph, plans[name], "cuda", RunMode(arena=arena), masters)
        ex.prepare()  # untimed placement may copy from pageable memory
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            ex.run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()


def test_no_hidden_synchronization(cnn):
    graph, plans = cnn
    run_without_synchronizing(graph, plans, ("async", "offload", "all-slow"))


def test_measured_peak_within_budget():
    # With the real runtime reserve, as users plan: torch's cuBLAS workspaces (about 65 MiB,
    # allocated at the first matmul and kept) live in the reserve, so the whole process stays
    # within the user's budget, not only within the cap (budget + slack). In a process of its
    # own: the reserve holds one run's workspaces, not those of every earlier test's streams.
    for run in in_own_process("tests.test_executor_gpu", "peak_runs"):
        assert run["cap_bytes"] is not None and run["peak_fast_bytes"] is not None, run
        assert run["budget_bytes"] is not None, run
        assert run["peak_fast_bytes"] <= run["budget_bytes"] < run["cap_bytes"], run
        assert run["alloc_retries"] is not None and run["alloc_retries"] >= 0, run
        assert run["host_median_s"] > 0, run


def peak_runs() -> list[dict]:
    """The test CNN's sync and async plans, made with the preset's real runtime reserve, run
    under their caps: what each run reports."""
    graph = _graph("cnn")
    plans = _plans(graph, reserve=preset("h100-pcie5").runtime_reserve_bytes)
    runs = []
    for name in ("sync", "async"):
        result = execute(graph, plans[name], device="cuda",
                         measure=Measure(iterations=2, warmup=1))
        runs.append({k: getattr(result, k) for k in (
            "cap_bytes", "peak_fast_bytes", "budget_bytes", "alloc_retries", "host_median_s")})
    return runs


def test_copies_are_joined_where_their_tensors_are_used():
    """The compute stream waits for an async copy at a record that uses its tensor (a kernel
    or re-run reading it, its free, a move of it, or a kernel that may write over it), not at
    the end of the kernel it overlaps (docs/planning.md, "Copies join at their use"), and a
    prefetch runs on beside the kernels before its use. Bitwise equality: the test above."""
    from autotm_py.memory.tiers import FAST
    from autotm_py.plan import Compute, Free, Move, Recompute

    graph = _graph("cnn")
    plan = _plans(graph)["async"]
    masters = {t: v.cpu() for t, v in init_values(graph, seed=0).items()}
    ex = Executor(graph, plan, device="cuda", masters=masters)
    issued: dict[object, tuple[int, int, str]] = {}  # event -> (record, tensor, to)
    joined: list[tuple[int, object]] = []
    copy, join = ex._copy_cuda, ex._join

    def logged_copy(tid, src, to, asynchronous):
        out = copy(tid, src, to, asynchronous)
        if asynchronous:
            issued[ex.state.pending[(tid, to)]] = (ex.index, tid, to)
        return out

    def logged_join(event):
        joined.append((ex.index, event))
        join(event)

    ex._copy_cuda, ex._join = logged_copy, logged_join
    ex.prepare()
    ex.run()
    torch.cuda.synchronize()
    records = plan.records
    assert any(to == FAST for _, _, to in issued.values()), "the plan prefetches nothing"
    def reads(index: int) -> set[int]:
        """What the record at `index` uses: a kernel's (or re-run's) inputs, those of the SGD
        updates run ahead with it in one foreach (`reuse.update_runs`), a move's or free's
        tensor."""
        out: set[int] = set()
        for i in ex.memory._updates.get(index, (index,)):
            record = records[i]
            if isinstance(record, (Compute, Recompute)):
                out |= set(graph.kernels[record.kernel].inputs)
            elif isinstance(record, (Free, Move)):
                out.add(record.tensor)
        return out

    later, wrong = 0, []
    for index, event in joined:
        if event not in issued:
            continue
        at, tid, to = issued[event]
        if tid not in reads(index):
            wrong.append(f"copy of {graph.name_of(tid)} to {to} joined at "
                         f"{ex.describe(records[index])}")
        overlapped = next(i for i in range(at, len(records)) if isinstance(records[i], Compute))
        later += to == FAST and index > overlapped
    assert not wrong, wrong[:5]
    assert later, "no prefetch ran on past the kernel it overlaps"


@pytest.mark.parametrize("pinned", [False, True])
@pytest.mark.parametrize("target_layout", [torch.channels_last, torch.contiguous_format])
def test_host_uploads_arrive_whole_in_order_and_in_layout(pinned, target_layout):
    """A batch from host memory reaches its device tensor asynchronously: a pinned source laid
    out as its target directly, any other through one staging buffer laid out as the target,
    reused only once its last copy has read it (three 64 MiB batches back to back: each
    arrives with its own values)."""
    from autotm_py.runtime.pinned import HostUploads

    uploads, got = HostUploads(), []
    for i in range(3):
        # distinct values per element: a layout mixed up on the way shows
        source = (torch.arange(64 * 64 * 64 * 64, dtype=torch.float32).reshape(64, 64, 64, 64)
                  + i).contiguous(memory_format=torch.channels_last)
        source = source.pin_memory() if pinned else source
        target = torch.empty(source.shape, device="cuda").contiguous(memory_format=target_layout)
        uploads.copy(7, source, target)
        got.append((source, target))
    torch.cuda.synchronize()
    for i, (source, target) in enumerate(got):
        assert target.is_contiguous(memory_format=target_layout)
        assert torch.equal(target.cpu(), source), f"batch {i}"
    direct = pinned and target_layout == torch.channels_last
    assert (len(uploads._staging) == 1) != direct


def test_the_slow_tier_is_pinned_at_its_own_size_and_copies_from_it_do_not_block():
    """The pool is registered with CUDA at its own size (5 MiB + 1 byte, where torch's pinned
    allocator takes 8 MiB and counts it): pinned, outside torch's host allocator, and a copy from
    it to the GPU returns before it is done as from torch's pinned memory."""
    from autotm_py.runtime import pinned

    before = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
    nbytes = (5 << 20) + 1
    assert pinned.pinned_footprint(nbytes, pin=True) == nbytes
    pool = pinned.PinnedPool({0: 0}, nbytes, pin=True)
    assert pool.buffer.numel() == nbytes and pool.buffer.is_pinned()
    assert torch.cuda.host_memory_stats().get("allocated_bytes.current", 0) == before
    source = pool.buffer[:4 << 20].view(torch.float32).fill_(1.5)
    target = torch.empty(source.shape, device="cuda")
    torch.cuda._sleep(50_000_000)  # the copy queues behind this kernel
    target.copy_(source, non_blocking=True)
    assert not torch.cuda.current_stream().query()  # returned before the copy ran
    torch.cuda.synchronize()
    assert bool((target == 1.5).all())
