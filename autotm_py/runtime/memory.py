"""The executor's memory strategies: where the fast copies of a plan's tensors live.

The executor (`runtime.executor`) interprets the plan's records on streams; a strategy decides
where each fast copy it makes lives and how kernels write their outputs there:

- `CachingMemory`: torch's caching allocator. Tensors are allocated where torch puts them, in
  stream order. An elementwise kernel writes its output over an input that dies at it
  (`runtime.reuse`), as autograd's in-place accumulation does, and runs of SGD updates go as
  one foreach update, as torch.optim does. With `static_inputs` (a CUDA graph replayed without
  an arena) the tensors an iteration starts with get fixed buffers (`StaticInputs`).
- `ArenaMemory`: every fast copy is a view of one arena at its planned offset (`DeviceArena`,
  `Plan.arena`). Kernels that can write their outputs in place (`kernels.into`) write into
  their slots; where the placed allocator is torch's (`runtime.placed`) the others allocate
  their outputs at their slots and their scratch in the record's window; elsewhere their
  outputs are copied into the slots. Runs of SGD updates written in place into their
  weights' slots go as one multi-tensor update (`ArenaMemory._run_sgd`), the learning rate
  read on the device where it is a tensor; a view that takes its dying input's slot
  (`arena._alias_views`) is found in its slot and copied nowhere.

The slow tier is the executor's pinned host pool (`runtime.pinned`) under every strategy.
A strategy reaches the executor it serves (`ex`) for the iteration's state and for ordering:
before a tensor's bytes are written over, the copies that still read them end
(`Executor.wait_for_copy_out`). New strategies subclass `CachingMemory` and are chosen by
`runtime.execute.memory_for`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import torch

from autotm_py.errors import ExecutionError
from autotm_py.kernels import run_kernel, run_kernel_into, run_kernel_raw
from autotm_py.kernels.grad_tensor import learning_rate, sgd_update_many
from autotm_py.kernels.util import empty_like_tensor, memory_format, overlaps, typed_view
from autotm_py.memory.scratch import OVERWRITES
from autotm_py.memory.tiers import FAST
from autotm_py.plan import INITIAL
from autotm_py.runtime import placed as placed_allocator
from autotm_py.runtime.device import prime_blas_workspaces
from autotm_py.runtime.reuse import overwritable_inputs, sgd_runs, update_runs

if TYPE_CHECKING:
    from autotm_py.ir.graph import Kernel, Tensor, TensorGraph
    from autotm_py.plan import ArenaLayout, Plan
    from autotm_py.runtime.executor import Executor

# The arena starts this far into its allocation, so that no slot's address is the address
# torch allocated (the placed allocator hands slot addresses to kernels' allocations, and torch
# keys its allocations by address: `runtime.placed`).
LEAD_BYTES = 512


class DeviceArena:
    """The plan's tensor region (`ArenaLayout.scratch_offset` bytes) on a device, allocated
    once per run, with typed views at planned offsets. The scratch region above it is left to
    torch's allocator (kernel workspaces, outputs not written in place), which the cap bounds:
    the arena plus the scratch fit the budget."""

    def __init__(self, layout: ArenaLayout, device: torch.device) -> None:
        self.layout = layout
        self.offsets = layout.offsets()
        self.nbytes = layout.scratch_offset
        self.buffer = torch.empty(LEAD_BYTES + self.nbytes, dtype=torch.uint8,
                                  device=device)[LEAD_BYTES:]
        self._views: dict[tuple[int, int], torch.Tensor | None] = {}
        # scratch windows (`autotm optimize --scratch windows`): a record's scratch inside the
        # tensors' region, as its bytes
        self._windows = {record: self.buffer[b.offset:b.offset + b.nbytes]
                         for record, b in layout.windows().items()}

    def window(self, record: int) -> torch.Tensor | None:
        """The scratch window of record `record` (its bytes), None if it has none."""
        return self._windows.get(record)

    def view(self, record: int, tensor: Tensor) -> torch.Tensor | None:
        """The slot of the fast copy of `tensor` made by record `record` (`INITIAL` for the
        initial placement), or None if the plan gives it none (pinned, zero-sized). Views are
        made once and kept: every iteration hands out the same tensors (no host work)."""
        key = (max(record, INITIAL), tensor.id)
        if key not in self._views:
            offset = self.offsets.get(key)
            self._views[key] = None if offset is None or tensor.nbytes == 0 else \
                typed_view(self.buffer[offset:offset + tensor.nbytes], tensor)
        return self._views[key]


class StaticInputs:
    """Fixed buffers for the fast copies an iteration starts with (weights, data, carried
    state), made once: the slots of a CUDA graph captured without an arena. The executor copies
    each carried value into its buffer as the iteration ends (`Executor.finish`), inside the
    captured iteration, so every replay starts from the last one's results. Any other fast
    copy has no slot (None): torch allocates it, from the graph's private pool while capturing.
    Unbounded: for runs without a cap (an arena is what keeps a capped capture in its budget)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._views: dict[int, torch.Tensor | None] = {}

    def view(self, record: int, tensor: Tensor) -> torch.Tensor | None:
        if record > INITIAL:
            return None
        if tensor.id not in self._views:
            self._views[tensor.id] = None if tensor.nbytes == 0 else \
                empty_like_tensor(tensor, self.device)
        return self._views[tensor.id]


def same_place(value: torch.Tensor, slot: torch.Tensor) -> bool:
    """Whether `value` is already the contents of `slot`: the same bytes, laid out alike."""
    return value.data_ptr() == slot.data_ptr() and value.dtype == slot.dtype and \
        value.shape == slot.shape and value.stride() == slot.stride()


class CachingMemory:
    """torch's caching allocator (module docstring). `sgd_foreach`: runs of SGD updates as one
    foreach update (not where kernels are timed one by one)."""

    arena: DeviceArena | None = None
    placed: placed_allocator.PlacedLib | None = None  # the placed allocator, where it serves
    defers_reuse = False  # whether a freed slot's next tenant waits for copies out of it

    def __init__(self, graph: TensorGraph, plan: Plan, device: torch.device, *,
                 static_inputs: bool = False, sgd_foreach: bool = True) -> None:
        # where fast copies live at fixed addresses: only those the iteration starts with
        # (`static_inputs`, for a CUDA graph without an arena), or none
        self.slots: DeviceArena | StaticInputs | None = \
            StaticInputs(device) if static_inputs else None
        # outputs written over inputs that die at their kernel (`reuse`)
        self._overwritable = overwritable_inputs(graph, plan)
        self._updates = update_runs(graph, plan, self._overwritable) if sgd_foreach else {}

    def scratch(self, ex: Executor, kernel_id: int) -> contextlib.AbstractContextManager[None]:
        """Where the current record's kernel allocates its scratch (nowhere special here)."""
        return contextlib.nullcontext()

    def launch(self, ex: Executor, kernel: Kernel, args: list[torch.Tensor],
               slots: list[torch.Tensor | None] | None) -> list[torch.Tensor]:
        """Run a Compute's kernel: over a dying input where it may, else as `run` does."""
        position = self._overwritable.get(ex.index)
        if position is not None:
            if ex.index in self._updates:
                self._run_updates(ex, self._updates[ex.index])
            if ex.index in ex.state.updated:
                return [args[position]]
            if self._may_overwrite(ex, kernel.inputs[position], args[position]) and \
                    run_kernel_into(kernel, args, [args[position]]):
                ex.state.overwritten += 1
                # the output owns the dead input's storage: no alias of it is live
                return [args[position]]
        outputs = self.run(ex, kernel, args, slots)
        if self._overwritable:
            _note_shared(ex, kernel, args, outputs)
        return outputs

    def run(self, ex: Executor, kernel: Kernel, args: list[torch.Tensor],
            slots: list[torch.Tensor | None] | None) -> list[torch.Tensor]:
        """Run a kernel (a Compute's or a Recompute's); its outputs where torch puts them."""
        return run_kernel(kernel, args)

    def _may_overwrite(self, ex: Executor, tid: int, arg: torch.Tensor) -> bool:
        """Whether a kernel may write its output over `arg`, its input `tid` that dies at it
        (`runtime.reuse`): only if `arg` owns its storage (no view or alias of it is live);
        a copy to the slow tier still reading it finishes first."""
        # every alias of a fast tensor comes from a kernel returning a view of (or the same
        # tensor as) its input, which `_note_shared` records: the other inputs are apart
        if tid in ex.state.shared or arg._base is not None or \
                not arg.is_contiguous(memory_format=memory_format(ex.graph.tensors[tid])):
            return False
        ex.wait_for_copy_out(tid)
        return True

    def _run_updates(self, ex: Executor, records: tuple[int, ...]) -> None:
        """Run a run of SGD updates (`reuse.update_runs`) as one foreach update over the
        weights it may write over, as torch.optim.SGD(foreach=True) does: the same
        `w + (-lr) * g` per element in one launch instead of one per weight (hundreds per
        iteration, each a few microseconds of host time). The others run at their records."""
        weights: list[torch.Tensor] = []
        grads: list[torch.Tensor] = []
        lr = 0.0
        for index in records:
            record = ex.plan.records[index]
            kernel = ex.graph.kernels[record.kernel]  # type: ignore[union-attr]
            w_id, g_id = kernel.inputs
            weight, grad = ex.read(w_id, FAST), ex.read(g_id, FAST)
            if self._may_overwrite(ex, w_id, weight):
                weights.append(weight)
                grads.append(grad)
                lr = float(kernel.attr("lr"))
                ex.state.updated.add(index)
        if weights:
            sgd_update_many(weights, grads, [], lr)  # a float lr, plain SGD: one foreach add
            ex.state.overwritten += len(weights)

    def notes(self, graph: TensorGraph, plan: Plan) -> list[str]:
        """What the run should say about its memory (nothing here)."""
        return []

    def fence(self, on: bool) -> None:
        """While a captured graph may replay, keep its scratch from other allocations (only
        the placed allocator needs to)."""

    def release(self) -> None:
        self.slots = None


def _note_shared(ex: Executor, kernel: Kernel, args: list[torch.Tensor],
                 outputs: list[torch.Tensor]) -> None:
    """Remember the tensors whose storage an output shares (a view of an input, or the input
    itself): none of them is ever written over. (A recompute re-runs a kernel that already ran
    this iteration, whose aliases are therefore recorded.)"""
    for out in outputs:
        shared = out._base is not None
        for arg in args:
            shared = shared or out is arg
        if shared:
            ex.state.shared.update(kernel.inputs)
            ex.state.shared.update(kernel.outputs)
            return


class ArenaMemory(CachingMemory):
    """Every fast copy at its planned offset in one arena (module docstring). Where the placed
    allocator is torch's in this process (`runtime.placed`, installed before CUDA was first
    used), kernels allocate their outputs at their slots and their scratch in their windows."""

    defers_reuse = True  # at planned addresses a slot's next tenant waits (`Executor.claim`)

    def __init__(self, layout: ArenaLayout, device: torch.device,
                 graph: TensorGraph | None = None, plan: Plan | None = None, *,
                 sgd_foreach: bool = True) -> None:
        if device.type == "cuda":
            prime_blas_workspaces(device)
        self.arena = DeviceArena(layout, device)
        self.slots = self.arena
        self._overwritable, self._updates = {}, {}
        # runs of SGD updates written in place into their weights' slots, run as multi-tensor
        # updates at their first record (`_run_sgd`; not where kernels are timed one by one)
        self._sgd_runs = sgd_runs(graph, plan) \
            if sgd_foreach and graph is not None and plan is not None else {}
        self.placed = placed_allocator.active()
        if self.placed is not None:
            self.placed.set_arena(self.arena.buffer.data_ptr(), self.arena.nbytes)
        # kernels that asked for more scratch than their window holds: name -> (largest
        # request served from outside it, the window's bytes), over every iteration
        self.spills: dict[str, tuple[int, int]] = {}

    def scratch(self, ex: Executor, kernel_id: int) -> contextlib.AbstractContextManager[None]:
        if self.placed is None:
            return contextlib.nullcontext()
        return self._window(ex, kernel_id)

    def launch(self, ex: Executor, kernel: Kernel, args: list[torch.Tensor],
               slots: list[torch.Tensor | None] | None) -> list[torch.Tensor]:
        """Run a Compute's kernel (`run`); the first SGD update of a run runs the run's
        updates as one multi-tensor update, and those are then done at their records."""
        if self._sgd_runs:
            run = self._sgd_runs.get(ex.index)
            if run is not None:
                self._run_sgd(ex, run)
            if ex.index in ex.state.updated:
                return slots  # type: ignore[return-value]  # W'[, buf'] written in place
        return super().launch(ex, kernel, args, slots)

    def _run_sgd(self, ex: Executor, records: tuple[int, ...]) -> None:
        """A run of SGD updates (`reuse.sgd_runs`) as torch.optim.SGD(foreach=True) or
        (fused=True) runs them: one multi-tensor update of every weight whose W' (and buf')
        takes W's (and buf's) slot in place (`grad_tensor.sgd_update_many`). Until now each
        update was its own `addcmul` (the lr a device tensor): 147 launches, 3.2 ms per step
        on a 0.85e9-parameter Llama on an H200 against torch's 2.6 ms of multi-tensor
        kernels. An update whose output has another slot runs at its own record."""
        assert self.arena is not None
        weights: list[torch.Tensor] = []
        grads: list[torch.Tensor] = []
        bufs: list[torch.Tensor] = []
        taken: list[int] = []
        first = ex.graph.kernels[ex.plan.records[records[0]].kernel]  # type: ignore[union-attr]
        momentum = float(first.attr("momentum", 0.0))
        for index in records:
            kernel = ex.graph.kernels[ex.plan.records[index].kernel]  # type: ignore[union-attr]
            pairs = [(kernel.inputs[0], kernel.outputs[0])]
            if momentum:
                pairs.append((kernel.inputs[2], kernel.outputs[1]))
            olds = [ex.read(tid, FAST) for tid, _ in pairs]
            news = [self.arena.view(index, ex.graph.tensors[tid]) for _, tid in pairs]
            grad = ex.read(kernel.inputs[1], FAST)
            if not all(new is not None and same_place(old, new) and not overlaps(grad, new)
                       for old, new in zip(olds, news, strict=True)):
                continue
            for (tid, _), new in zip(pairs, news, strict=True):
                if ex.state.busy:
                    ex.claim(new, None)  # type: ignore[arg-type]
                ex.wait_for_copy_out(tid)  # a copy of W (buf) to the slow tier ends first
            weights.append(olds[0])
            grads.append(grad)
            bufs += olds[1:]
            taken.append(index)
        if len(taken) < 2:
            return  # each at its record, as before
        lr = learning_rate(first, [ex.read(first.inputs[-1], FAST)]) \
            if first.attr("lr") is None else float(first.attr("lr"))
        if sgd_update_many(weights, grads, bufs, lr, momentum,
                           float(first.attr("weight_decay", 0.0)),
                           bool(first.attr("nesterov", 0))):
            ex.state.updated.update(taken)

    @contextlib.contextmanager
    def _window(self, ex: Executor, kernel_id: int) -> Iterator[None]:
        """The current record's scratch window (a plan with `--scratch windows`): while the
        kernel runs, its workspaces and temporaries are allocated there (`runtime.placed`).
        What the kernel returns must be gone when it closes: the record's handler runs inside
        it and drops its locals first. No window (none planned): the kernel allocates beside
        the arena, as without windows. Either way the record is named to the placed allocator
        while it runs, for its report of requests beyond the cap."""
        assert self.placed is not None and self.arena is not None
        window = self.arena.window(ex.index)
        if window is not None and ex.state.busy:
            ex.claim(window, None)  # freed tensors there may still be copied out
        self.placed.tag(ex.index)
        try:
            if window is None:
                yield
                return
            with self.placed.window(window.data_ptr(), window.numel()) as use:
                yield
        except placed_allocator.WindowLeak as exc:
            name = ex.graph.kernels[kernel_id].name
            raise ExecutionError(f"kernel {name!r}: {exc}; its window's bytes hold other "
                                 "tensors from now on (plan with --scratch region)") from None
        finally:
            self.placed.tag(-1)
        if use.largest_spill:
            name = ex.graph.kernels[kernel_id].name
            largest = max(use.largest_spill, self.spills.get(name, (0, 0))[0])
            self.spills[name] = (largest, window.numel())

    def run(self, ex: Executor, kernel: Kernel, args: list[torch.Tensor],
            slots: list[torch.Tensor | None] | None) -> list[torch.Tensor]:
        """Run a kernel: written in place where it can be (each slot still at its planned
        address afterwards, and none shared with an input), else the raw outputs, which the
        executor copies into their slots (allocated there by the placed allocator where it
        serves)."""
        if slots is None or not any(s is not None for s in slots):
            return run_kernel(kernel, args)
        direct = all(s is not None and all(self._may_write(ex, kernel, s, i, a)
                                           for i, a in enumerate(args))
                     for s in slots)
        if direct:
            where = [(s.data_ptr(), s.shape) for s in slots if s is not None]
            if run_kernel_into(kernel, args, slots):
                if [(s.data_ptr(), s.shape) for s in slots if s is not None] == where:
                    return slots  # type: ignore[return-value]
                raise ExecutionError(f"kernel {kernel.name!r} ({kernel.op_type}) moved or "
                                     "resized an output in its slot; its direct path is wrong")
        if self.placed is None:
            return run_kernel_raw(kernel, args)
        return self._run_placed(kernel, args, slots)

    def _run_placed(self, kernel: Kernel, args: list[torch.Tensor],
                    slots: list[torch.Tensor | None]) -> list[torch.Tensor]:
        """Run a kernel with no `out=` form so that the allocations of its outputs' sizes get
        their slots' addresses (`runtime.placed`); a slot an input still occupies is not
        offered. An output that landed in another output's slot (same size, allocated in
        another order) is moved out first, so that the copies into the slots overwrite nothing
        still to be read."""
        offered = [(s.data_ptr(), s.numel() * s.element_size()) for s in slots
                   if s is not None and not any(overlaps(s, a) for a in args)]
        with self.placed.expecting(offered):  # type: ignore[union-attr]
            outputs = run_kernel_raw(kernel, args)
        taken = {start for start, _ in offered}
        return [out.clone() if out.data_ptr() in taken and
                (slot is None or not same_place(out, slot)) else out
                for out, slot in zip(outputs, slots, strict=True)]

    def _may_write(self, ex: Executor, kernel: Kernel, slot: torch.Tensor, position: int,
                   arg: torch.Tensor) -> bool:
        """Whether a kernel may write into `slot` while it reads `arg`, its input at `position`:
        they do not meet, or `arg` is exactly the slot (an output taking its input's slot in
        place) and the kernel may overwrite that input (`OVERWRITES`); a copy still reading
        `arg` then finishes first."""
        if not overlaps(slot, arg):
            return True
        if position not in OVERWRITES.get(kernel.op_type, ()) or \
                slot.data_ptr() != arg.data_ptr() or \
                slot.numel() * slot.element_size() != arg.numel() * arg.element_size():
            return False
        ex.wait_for_copy_out(kernel.inputs[position])
        return True

    def notes(self, graph: TensorGraph, plan: Plan) -> list[str]:
        notes = [spill_note(self.spills)] if self.spills else []
        misses = self.placed.misses() if self.placed is not None else None
        if misses:
            notes.append(miss_note(graph, plan, misses))
        return notes

    def fence(self, on: bool) -> None:
        """While a captured graph may replay, nothing else gets the placed allocator's scratch
        that the graph's kernels write (torch's caching allocator keeps a capture's blocks in
        its private pool instead)."""
        if self.placed is not None:
            self.placed.fence(on)

    def release(self) -> None:
        self.arena = self.slots = None


def spill_note(spills: Mapping[str, tuple[int, int]], shown: int = 3) -> str:
    """What a run says when kernels asked for more scratch than their windows hold (their
    requests then came from the region beyond the arena, or overflowed it): the largest ones."""
    worst = sorted(spills.items(), key=lambda kv: -kv[1][0])
    parts = [f"{name!r} {largest / 2**20:.0f} MiB (window {window / 2**20:.0f} MiB)"
             for name, (largest, window) in worst[:shown]]
    more = f" and {len(worst) - shown} more" if len(worst) > shown else ""
    return (f"scratch beyond its window at {len(spills)} kernel(s), largest requests: "
            f"{', '.join(parts)}{more}; served beside the arena (their profile's workspace "
            "is smaller than what they allocate here: profile on this GPU)")


def miss_note(graph: TensorGraph, plan: Plan, misses: list[tuple[int, int]],
              shown: int = 4) -> str:
    """Where the placed allocator's region (the cap) had no room: the largest requests that
    went beyond it, with the records that made them (-1: between kernels)."""
    parts = []
    for record, nbytes in misses[:shown]:
        step = plan.records[record] if 0 <= record < len(plan.records) else None
        kernel = getattr(step, "kernel", None)
        where = "between kernels" if kernel is None else \
            f"at {graph.kernels[kernel].name!r} (record #{record})"
        parts.append(f"{nbytes / 2**20:.1f} MiB {where}")
    return ("requests beyond the cap (the placed allocator's region had no room), largest: "
            + ", ".join(parts))
