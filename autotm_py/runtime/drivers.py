"""How the executor's iterations are driven: eagerly, or captured once as a CUDA graph and
replayed.

`EagerDriver`: every iteration runs the plan's records from Python (`Executor.run`).

`ReplayDriver` (CUDA): after the warm-up, one steady-state iteration is captured as a CUDA
graph (`GraphReplay`) and the later ones replay it. The memory strategy gives every tensor the
iteration starts with a fixed address (an arena, or static inputs), the pinned pool every slow
copy, and what kernels allocate during the capture comes from the graph's private pool, so a
replay reads and writes exactly what an eager iteration of the same plan would. The copy
streams fork from the capturing stream and join it (the executor's events), as CUDA requires.
A capture that fails leaves the run eager, with a note naming the record it failed at.

Both answer `begin(i, warmup)` (whether iteration i runs, doing what it needs first) and
`step()` (the callable that runs one prepared iteration); `runtime.execute` times them.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from autotm_py.errors import ExecutionError
from autotm_py.runtime import placed
from autotm_py.runtime.device import (
    cuda_index,
    eager_work_queues_note,
    peaks,
    release_blas_workspaces,
    reset_peaks,
    set_cap,
)
from autotm_py.runtime.executor import State, side_streams

if TYPE_CHECKING:
    from autotm_py.runtime.executor import Executor

log = logging.getLogger(__name__)

# How much more than the cap a capture in an arena may hold, once, under a capped run. Capturing
# allocates kernels' scratch from the graph's private pool, which cannot reuse the blocks the eager
# warm-up left in the default pool (nor they its), so for the capture's duration both pools hold
# memory; measured on the H100 (experiments/journal/gpu-2026-11.md), joint plans that replay within
# budget + 64 MiB failed their capture under that cap. The replays allocate nothing: they run under
# the cap. A capture with static inputs gets no allowance: its private pool holds the whole
# iteration and stays reserved while the graph replays, so the capture itself must fit the cap.
CAPTURE_ALLOWANCE = 256 << 20


class EagerDriver:
    """Every iteration from Python."""

    replayed = False
    capture_reserved: int | None = None

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.notes: list[str] = []

    def begin(self, i: int, warmup: int, cap: int | None = None) -> bool:
        return True

    def step(self) -> Callable[[], None]:
        return self.executor.run

    def release(self) -> None:
        pass


class ReplayDriver(EagerDriver):
    """Eager warm-up, one capture, replays (module docstring)."""

    def __init__(self, executor: Executor) -> None:
        super().__init__(executor)
        assert executor.cuda, "CUDA graphs need a CUDA device"
        self.stream = side_streams(executor.device)[2]
        self._graph: GraphReplay | None = None
        self._end: tuple[State, dict] | None = None
        # the events the capture recorded (`Executor._captured_events`): its event record
        # nodes use them, so they live exactly as long as the graph
        self._events: list[torch.cuda.Event] = []

    def begin(self, i: int, warmup: int, cap: int | None = None) -> bool:
        """Iteration i of a timed run: the last warm-up iteration runs on the capture's
        stream (untimed), the first timed one is captured, the others replay it."""
        if i == 0 and warmup == 0:  # kernels set themselves up (cuBLAS, cuDNN) outside a capture
            self.warm_up_to_capture()
        if i == warmup - 1:
            self.warm_up_to_capture()
            return False
        if i == warmup:
            failed, self.capture_reserved = self._capture_under(cap)
            self.replayed = failed is None
            if failed is not None:
                self.notes.append(f"no CUDA graph: capture failed at {failed}; ran eagerly"
                                  + eager_work_queues_note())
        return True

    def step(self) -> Callable[[], None]:
        return self.replay if self.replayed else self.executor.run

    def warm_up_to_capture(self) -> None:
        """`warm_up`, after freeing the cuBLAS workspaces of the streams that ran before: from
        now on only the capture's stream runs kernels (the replays run what it captured), and
        theirs would sit in the cap unused."""
        release_blas_workspaces(self.executor.device)
        self.warm_up()

    def warm_up(self) -> None:
        """One eager iteration on the stream that `capture` will use, so that cuBLAS and cuDNN
        set themselves up for it (a capture cannot) and pick the algorithms it will replay."""
        ex = self.executor
        current = torch.cuda.current_stream(ex.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            ex.prepare()
            ex.run()
        current.wait_stream(self.stream)

    def _capture_under(self, cap: int | None) -> tuple[str | None, int | None]:
        """Capture the iteration; under a cap in an arena, with `CAPTURE_ALLOWANCE` more for
        the capture's duration. Returns why it failed (None if not) and the most the allocator
        reserved meanwhile."""
        ex = self.executor
        # Count the capture alone: the eager iterations before it left blocks cached on two
        # streams (the timed loop's and the capture's), which the capture returns anyway; the
        # last one's outputs go now (its carried values stay for the capture's `prepare`).
        ex.state = State()
        torch.cuda.synchronize(ex.device)
        torch.cuda.empty_cache()
        reset_peaks(ex.device)
        allowance = cap is not None and ex.memory.arena is not None
        if allowance:
            set_cap(ex.device, cap + CAPTURE_ALLOWANCE)
        try:
            failed = self.capture()
        finally:
            if allowance:
                set_cap(ex.device, cap)
        return failed, peaks(ex.device)[1]

    def capture(self) -> str | None:
        """Capture one iteration as a CUDA graph (after `warm_up`); later `replay()`s run it.
        Returns why it failed (the record and the error), None if not."""
        ex = self.executor
        ex.prepare()
        _hold_overflow(True)
        graph = GraphReplay(ex.run, ex.where, self.stream)
        self._events = ex.take_captured_events()
        if graph.failed is not None:
            # the tensors of the partial iteration live in the graph's private pool; until
            # they go (and the cache is emptied) its blocks count against the cap of the eager
            # iterations that follow
            ex.state = State()
            give_back(ex.device)
            _hold_overflow(False)
            ex.prepare()
            return graph.failed
        weakref.finalize(graph, _hold_overflow, False)  # the hold lasts as long as the graph
        self._graph, self._end = graph, (ex.state, ex.carry)
        ex.memory.fence(True)
        return None

    def replay(self) -> None:
        """Run the captured iteration (after `prepare()` placed its inputs); afterwards the
        executor holds the iteration's results as after `run()`."""
        if self._graph is None or self._end is None:
            raise ExecutionError("no captured iteration to replay; call capture() first")
        self._graph.replay()
        self.executor.state, self.executor.carry = self._end

    def release(self) -> None:
        self._graph = self._end = None
        self._events = []  # after the graph that records them


def _hold_overflow(on: bool) -> None:
    """Under the placed allocator, keep what overflows its region for a graph about to be
    captured (True), or let it go with that graph (False): `PlacedLib.hold_overflow`."""
    lib = placed.active()
    if lib is not None:
        lib.hold_overflow(on)


def give_back(device: torch.device | None) -> None:
    """Return what a failed run or capture no longer references to the driver: the collector
    first (an error's traceback may hold the last references to its tensors in a cycle), then
    the allocator's cache, so that it does not count against the next run's cap."""
    import gc

    gc.collect()
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


class GraphReplay:
    """Capture `body` (one iteration) on `stream` as a CUDA graph; `replay()` runs it. The
    caller has run an eager iteration on `stream` first (cuBLAS and cuDNN set themselves up per
    stream, which a capture does not allow). `failed` says why the capture did not work (None
    if it did): the caller runs eagerly."""

    def __init__(self, body: Callable[[], None], where: Callable[[], str],
                 stream: torch.cuda.Stream) -> None:
        self.graph: torch.cuda.CUDAGraph | None = torch.cuda.CUDAGraph()
        self.failed: str | None = None
        first: list[str] = []

        def guarded() -> None:
            try:
                body()
            except Exception as exc:
                first.append(f"{where()}: {_first_line(exc)}")  # before capture_end's error
                raise

        rng = _default_generator(stream.device)
        rng_before = rng.get_state()
        # The blocks the eager warm-up left cached serve no allocation of the capture (it
        # allocates from the graph's private pool) but count against the cap: hand them back.
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        pool = torch.cuda.graph_pool_handle()
        begun = ended = False
        try:
            with torch.cuda.stream(stream):
                self.graph.capture_begin(pool=pool)
                begun = True
                try:
                    guarded()
                finally:
                    self.graph.capture_end()
                    ended = True
        except Exception as exc:  # any failure means: run eagerly, and say why
            self.failed = first[0] if first else f"capture: {_first_line(exc)}"
            log.info("CUDA graph capture failed at %s", self.failed)
            torch.cuda.synchronize()
            _restore_generator(rng, rng_before)
            self.graph = None  # torch releases its pool if the capture ended
            if begun and not ended:
                _release_pool(stream.device, pool)
            torch.cuda.empty_cache()

    def replay(self) -> None:
        assert self.graph is not None, "replay() of a capture that failed"
        self.graph.replay()


def _default_generator(device: torch.device) -> torch.Generator:
    return torch.cuda.default_generators[cuda_index(device)]


def _release_pool(device: torch.device, pool: tuple[int, int]) -> None:
    """Give the private pool of a capture that never ended back to the allocator. torch
    releases a graph's pool when the graph goes only if `capture_end` succeeded; where it
    raised (an invalidated capture), the blocks the capture allocated stayed cached for the
    rest of the process, counted against every later run's cap. `_cuda_endAllocateToPool` and
    `_cuda_releasePool` are torch's own calls for that (`torch.cuda.use_mem_pool` ends with
    them); without them (another torch) the blocks stay."""
    index = cuda_index(device)
    end = getattr(torch._C, "_cuda_endAllocateToPool", None)
    if end is not None:
        # capture_end raised before it told the allocator the capture was over: until it is
        # told, the allocator believes a capture is under way and neither empty_cache nor its
        # own retry after an out-of-memory gives anything back (on the H100 every later capped
        # run of the process then ran out of memory)
        with contextlib.suppress(RuntimeError):  # (raised where it was told)
            end(index, pool)
    release = getattr(torch._C, "_cuda_releasePool", None)
    if release is not None:
        release(index, pool)


def _restore_generator(rng: torch.Generator, state: torch.Tensor) -> None:
    """Give the device's default generator a fresh state equal to `state` (its seed and offset
    before the capture). A capture that fails inside `capture_end` never runs the generator's
    capture epilogue, so the generator stays marked as capturing and every later random op of
    the process (dropout, torch.rand) fails with "Offset increment outside graph capture";
    swapping in a fresh state object clears that, and random ops go on as if the capture had
    not been tried."""
    fresh = torch.Generator(device=rng.device)
    fresh.set_state(state)
    rng.graphsafe_set_state(fresh)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
