"""`MachineModel`: what things cost on one memory system, for one graph.

The ILP, the baselines and the simulator all price kernels, copies and memory through this one
object, so that a plan's predicted time is the same number whoever computes it:

- kernel time: GPU mode, the profiled all-fast time (every input and output must be in fast
  memory); host mode, `placement_time` for the tiers of its inputs and outputs:

      t(k, placement) = t_fast(k)
                + sum over inputs  i in slow: bytes_i * (1/slow.read_bw  - 1/fast.read_bw)
                + sum over outputs o in slow: bytes_o * (1/slow.write_bw - 1/fast.write_bw)

  i.e. each operand is streamed once, and an operand in the slow tier streams at the slow
  tier's bandwidth instead of the fast tier's; measured per-placement times
  (`KernelCosts.measured_placements`, a real slow tier) replace the model;
- copy time: latency + bytes / bandwidth of the link, per direction, blocking or overlapped;
- step time of a kernel with overlapped copies: max(kernel time, each `MemorySystem.async_terms`
  sum over its copies);
- bytes: `accounting.aligned` sizes; pinned tensors outside the budget; the workspace of a
  kernel counts while it runs.

`run` (an `options.RunMode`) says how the plan runs. `run.replay` (GPU mode): the iteration
is replayed as a CUDA graph (`autotm run --replay`), so
the host enqueues it at once and no kernel waits for its dispatch: every kernel costs its device
time (`KernelCosts.replayed`), for the ILP's objective and both clocks of the simulator alike,
and every copy costs `costs.REPLAY_TO_FAST_SLOWDOWN` or `REPLAY_TO_SLOW_SLOWDOWN` times its
eager time, by direction (`copying`; 1.0 since replays run with one hardware work queue, with
which their copies run at eager speed).
With `run.arena` the replay also copies the outputs torch allocates into their slots; without, it
replays with static inputs on torch's caching allocator (under the cap when the budget is set)
and copies nothing, and like an eager plan on that allocator it needs `headroom` for
fragmentation.

`run.arena` (GPU mode): the plan runs in an arena (`autotm_py.arena`): its tensors at planned
offsets, and what kernels allocate themselves (workspace, outputs they cannot write in place:
`memory.scratch`) in one scratch region beside it, as large as the largest kernel's scratch
(`scratch_reserve`). The capacity rows then bound the tensors alone (`workspace` is zero) by the
tensor budget (`tensor_budget`: the user's budget less the runtime reserve, the headroom and
the scratch region). `arena_margin`: bytes the planner holds back so that the packed arena
fits (the pipeline's fit loop). `run.scratch` windows (an arena run with the placed
allocator): each kernel's scratch of at least `WINDOW_MIN_BYTES` gets a window of its own inside
the arena instead, live only while the kernel runs (`autotm optimize --scratch windows`, the
default there), and each capacity row counts its kernel's window beside the tensors
(`workspace`); smaller scratch shares a region of less than `WINDOW_MIN_BYTES`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from autotm_py.config import GPU_DEVICE_BYTES
from autotm_py.costs import REPLAY_TO_FAST_SLOWDOWN, REPLAY_TO_SLOW_SLOWDOWN
from autotm_py.errors import ConfigError
from autotm_py.ir.host_updates import drained_tensors, fed_tensors
from autotm_py.ir.rerun import rerun_kernel, rerun_share
from autotm_py.memory import accounting
from autotm_py.memory.scratch import allocated_outputs, copied_outputs
from autotm_py.memory.tiers import FAST, SLOW
from autotm_py.options import RunMode
from autotm_py.units import format_bytes

if TYPE_CHECKING:
    from autotm_py.costs import KernelCosts
    from autotm_py.ir.graph import Kernel, TensorGraph
    from autotm_py.memory.tiers import MemorySystem


def working_sets(graph: TensorGraph, costs: KernelCosts | None = None) -> np.ndarray:
    """Per kernel: its distinct inputs + outputs + workspace as the planner counts them
    (aligned sizes; the larger of the IR's and the profiled workspace), the fast memory a GPU
    plan needs free to run it. Without costs, the IR's workspaces alone."""
    sizes = accounting.aligned_sizes(graph)
    measured = (costs.workspace_bytes if costs is not None else None) or \
        (0,) * len(graph.kernels)
    return np.array([int(sizes[list(set(k.io))].sum())
                     + accounting.aligned(max(k.workspace_bytes, int(w)))
                     for k, w in zip(graph.kernels, measured, strict=True)], dtype=np.int64)


# A scratch window's room beyond the profiled scratch: the profile rounds what a kernel
# allocated, and a window exactly that large was a few hundred bytes short of cuDNN's
# weight-gradient workspace for VGG19's first convolutions on the H200 (2026-11-28: 1646379687
# bytes asked, 1646379520 profiled), which then went beyond the cap.
WINDOW_SLACK_BYTES = 1 << 20
# Kernels whose scratch is smaller get no window: the placed allocator serves requests under
# this size from the region beside the arena (`runtime/placed_alloc.c`, WINDOW_MIN), so such a
# window would hold nothing; their scratch shares a region of at most this size instead.
WINDOW_MIN_BYTES = 1 << 20


@dataclass(frozen=True)
class MachineModel:
    """A graph on a memory system with kernel costs; `memory.budget_bytes` is the budget."""

    graph: TensorGraph
    memory: MemorySystem
    costs: KernelCosts
    pin_weights: bool = False
    headroom: float = 0.0  # share of the budget left free for allocator fragmentation
    run: RunMode = field(default_factory=RunMode)  # how the plan runs: module docstring
    arena_margin: int = 0  # bytes held back so that the packed arena fits (fit loop)
    # the costs as given (`profile_costs`), before `costs` takes their replay form: set here,
    # and passed on by `dataclasses.replace`, which would otherwise hand the replay form in as
    # `costs` to be replayed again (estimated kernels' slot copies counted twice) and recorded
    # in the plan's header as its profiles (a drift warning on every later `simulate`); so a
    # `replace` keeps the given costs: other costs make a new MachineModel
    given_costs: KernelCosts | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.given_costs is None:
            object.__setattr__(self, "given_costs", self.costs)
        else:  # a `replace` of a machine: price from what it was given
            object.__setattr__(self, "costs", self.given_costs)
        if self.replays:
            object.__setattr__(self, "costs", self.costs.replayed(
                self._slot_copy_bytes(), self._io_bytes(), self._folded_updates()))
        n = len(self.graph.kernels)
        if len(self.costs.times_s) != n:
            raise ConfigError(f"kernel costs cover {len(self.costs.times_s)} kernels but graph "
                              f"{self.graph.name!r} has {n}; profile this graph (same --batch, "
                              "--dim and --training)")

    @property
    def replays(self) -> bool:
        """Priced for CUDA-graph replay: `run.replay` in GPU mode (the host has no graphs)."""
        return self.run.replay and self.gpu

    def _io_bytes(self) -> list[int]:
        """Per kernel, the bytes it reads and writes (its distinct inputs and outputs): their
        real sizes, not `io_bytes`' accounted ones, which count a pinned weight as 0 bytes
        although the kernel still reads it."""
        sizes = self.graph.tensor_bytes
        return [int(sum(sizes[t] for t in set(k.io))) for k in self.graph.kernels]

    def _folded_updates(self) -> list[bool] | None:
        """Per kernel, whether an arena run folds it into a multi-tensor launch: every SGD
        update, which the executor runs with its neighbours as one foreach update
        (`runtime.reuse.sgd_runs`; an update alone between other kernels is rare and small).
        ResNet-200 b64 bf16's 611 updates, priced at their times alone, added 2.4 ms to a
        47.5 ms replay that spent 0.46 ms on them (H200, 2026-12-04)."""
        if not self.run.arena:
            return None
        return [k.op_type == "SGDUpdate" for k in self.graph.kernels]

    def _slot_copy_bytes(self) -> list[int] | None:
        """Per kernel, the bytes a replay copies into arena slots: a plan with an arena replays
        in it (`api.execute`), where outputs that torch allocates are copied into their slots;
        any other replay, capped or not, uses static inputs (no slots, nothing copied)."""
        if not self.run.arena:
            return None
        return self._output_bytes([t.nbytes for t in self.graph.tensors], copied_outputs).tolist()

    def _output_bytes(self, sizes: Sequence[int] | np.ndarray,
                      which: Callable[..., list[int]] = allocated_outputs) -> np.ndarray:
        """Per kernel: the `sizes` of its outputs that `which` names in an arena run (those
        torch allocates, `memory.scratch.allocated_outputs`, or those copied into their slots,
        `copied_outputs`)."""
        return np.array([sum(int(sizes[t]) for t in which(self.graph, k, self.places_outputs))
                         for k in self.graph.kernels], dtype=np.int64)

    @property
    def profile_costs(self) -> KernelCosts:
        """The costs as given (`costs` holds their graph-replay form when `run.replay`):
        what a plan's header records and what today's profiles are compared with."""
        assert self.given_costs is not None  # set by __post_init__
        return self.given_costs

    # ---- bytes ---------------------------------------------------------------------------
    @property
    def tensor_budget(self) -> int | None:
        """Bytes the plan's tensors and workspaces may use: the budget minus the runtime's
        own reserve (`MemorySystem.runtime_reserve_bytes`), the fragmentation headroom and the
        arena margin."""
        total = self.memory.budget_bytes
        if total is None:
            return None
        return max(total - self.memory.runtime_reserve_bytes - int(total * self.headroom)
                   - self.scratch_reserve - self.arena_margin, 0)

    @property
    def arena_limit(self) -> int | None:
        """The largest arena (tensors and scratch region) that fits the budget."""
        total = self.memory.budget_bytes
        if total is None:
            return None
        return max(total - self.memory.runtime_reserve_bytes - int(total * self.headroom), 0)

    def user_terms(self, plan_bytes: int) -> int:
        """The budget a user must give for the plan's tensors to have `plan_bytes`."""
        return math.ceil((plan_bytes + self.memory.runtime_reserve_bytes + self.scratch_reserve
                          + self.arena_margin) / (1.0 - self.headroom))

    @property
    def user_budget(self) -> int | None:
        """The budget as given (ratio or --fast-mem): the whole process's fast memory."""
        return self.memory.budget_bytes

    @property
    def reserve_bytes(self) -> int:
        """Fast memory the runtime keeps whatever the plan (`--reserve`, the memory system's
        `runtime_reserve_bytes`)."""
        return int(self.memory.runtime_reserve_bytes)

    @property
    def headroom_bytes(self) -> int:
        """The share of the user's budget left free for fragmentation, in bytes."""
        total = self.memory.budget_bytes
        return 0 if total is None else int(total * self.headroom)

    @property
    def gpu(self) -> bool:
        return self.memory.mode == "gpu"

    @cached_property
    def pinned(self) -> frozenset[int]:
        return accounting.pinned_tensors(self.graph, self.pin_weights)

    @cached_property
    def fed(self) -> frozenset[int]:
        """Tensors the host writes before each iteration (`ir.host_updates`): they start in
        the slow tier."""
        return fed_tensors(self.graph)

    @cached_property
    def drained(self) -> frozenset[int]:
        """Gradients the host reads after each iteration (`ir.host_updates`): they end in the
        slow tier."""
        return drained_tensors(self.graph)

    @cached_property
    def sizes(self) -> np.ndarray:
        """Accounted bytes per tensor: aligned, 0 for pinned tensors (outside the budget)."""
        sizes = accounting.aligned_sizes(self.graph)
        if self.pinned:
            sizes[list(self.pinned)] = 0
        return sizes

    @property
    def arena_mode(self) -> bool:
        return self.run.arena and self.gpu

    @property
    def places_outputs(self) -> bool:
        """An arena run with the placed allocator: the outputs of `memory.scratch.PLACED_OPS`
        are allocated at their slots, neither scratch nor copied."""
        return self.run.places_outputs

    @cached_property
    def kernel_workspace(self) -> np.ndarray:
        """Per kernel: the larger of the IR's workspace and the measured one (profiles)."""
        measured = self.costs.workspace_bytes or (0,) * len(self.graph.kernels)
        return np.array([accounting.aligned(max(k.workspace_bytes, int(w)))
                         for k, w in zip(self.graph.kernels, measured, strict=True)],
                        dtype=np.int64)

    @property
    def windowed(self) -> bool:
        """An arena run whose kernels' scratch lies in windows inside the arena."""
        return self.arena_mode and self.run.places_outputs and self.run.windows

    @cached_property
    def workspace(self) -> np.ndarray:
        """Per kernel: the bytes its capacity row counts beside its tensors, its workspace; in
        arena mode none (the scratch region holds every kernel's workspace), with scratch
        windows the scratch of the kernels that have one (the window lies among the tensors
        while the kernel runs)."""
        if self.windowed:
            return np.where(self.windows, self.scratch, 0)
        if self.arena_mode:
            return np.zeros(len(self.graph.kernels), dtype=np.int64)
        return self.kernel_workspace

    @cached_property
    def windows(self) -> np.ndarray:
        """Per kernel: whether its scratch has a window of its own (scratch windows, and at
        least `WINDOW_MIN_BYTES` of scratch); the others' scratch is in the region."""
        base = self._kernel_scratch
        return base >= WINDOW_MIN_BYTES if self.windowed else np.zeros(len(base), dtype=bool)

    @cached_property
    def _kernel_scratch(self) -> np.ndarray:
        return self.kernel_workspace + self._output_bytes(self.sizes)

    @cached_property
    def scratch(self) -> np.ndarray:
        """Per kernel: its scratch in an arena run, workspace plus the fast outputs that
        torch allocates (`memory.scratch`; pinned outputs are outside the budget); a window,
        `WINDOW_SLACK_BYTES` more."""
        return self._kernel_scratch + np.where(self.windows, WINDOW_SLACK_BYTES, 0)

    @cached_property
    def scratch_reserve(self) -> int:
        """Arena mode: the scratch region, the largest scratch of a kernel without a window
        (with scratch windows: under `WINDOW_MIN_BYTES`); else 0."""
        if not self.arena_mode or not self.graph.kernels:
            return 0
        return int(np.where(self.windows, 0, self.scratch).max())

    @cached_property
    def live_ranges(self) -> tuple[tuple[int, int], ...]:
        return accounting.live_ranges(self.graph)

    @cached_property
    def steady_pairs(self) -> tuple[tuple[int, int], ...]:
        return tuple((a, z) for a, z in accounting.steady_pairs(self.graph)
                     if a not in self.pinned)

    @cached_property
    def survivors(self) -> frozenset[int]:
        """Tensors that must exist after the last kernel (outputs, persistent, carried ends)."""
        last = len(self.graph.kernels) - 1
        out = {t for t, (_, end) in enumerate(self.live_ranges)
               if end == last and self.graph.survives_iteration(t)}
        out.update(z for _, z in self.graph.carried)
        return frozenset(out)

    @cached_property
    def peak(self) -> tuple[int, int]:
        """(bytes, kernel) of the all-fast peak in accounted bytes, workspace included."""
        if not self.graph.kernels:
            return 0, -1
        live = self.live_bytes(range(len(self.graph.tensors))) + self.workspace
        kid = int(live.argmax())
        return int(live[kid]), kid

    def live_bytes(self, tensors: Iterable[int],
                   ranges: Sequence[tuple[int, int]] | None = None) -> np.ndarray:
        """Per kernel, the accounted bytes of the given tensors live there (over `ranges`,
        default their live ranges)."""
        return accounting.live_bytes(len(self.graph.kernels), self.sizes,
                                     self.live_ranges if ranges is None else ranges, tensors)

    def io_bytes(self, kid: int) -> int:
        """Accounted bytes of a kernel's distinct inputs and outputs."""
        return int(sum(self.sizes[t] for t in set(self.graph.kernels[kid].io)))

    # ---- time ----------------------------------------------------------------------------
    def kernel_time(self, kid: int, placement: Sequence[str]) -> float:
        """Seconds of kernel `kid` with its IO slots in the given tiers."""
        if self.gpu:
            return self.costs.times_s[kid]
        return self.placement_time(kid, placement)

    def placement_time(self, kid: int, placement: Sequence[str]) -> float:
        """Host mode: time of kernel `kid` with its IO slots in the given tiers (the model in
        the module docstring, or a measured time of that placement)."""
        code = "".join("S" if p == SLOW else "F" for p in placement)
        measured = self.costs.measured_placements.get(kid)
        if measured is not None and code in measured:
            return measured[code]
        kernel = self.graph.kernels[kid]
        extra = 0.0
        n_in = len(kernel.inputs)
        fast, slow = self.memory.fast, self.memory.slow
        for slot, tid in enumerate(kernel.io):
            if placement[slot] != SLOW:
                continue
            nbytes = self.graph.tensors[tid].nbytes
            if slot < n_in:
                extra += nbytes * (1.0 / slow.read_bw - 1.0 / fast.read_bw)
            else:
                extra += nbytes * (1.0 / slow.write_bw - 1.0 / fast.write_bw)
        return self.costs.times_s[kid] + max(extra, 0.0)

    def device_time(self, kid: int) -> float:
        """Seconds kernel `kid` keeps the GPU busy: its device time where a profile measured
        one (GPU mode), else its time. It may exceed its in-context time, which is an event
        interval with the event overhead taken off in equal shares."""
        device = self.costs.device_s[kid] if self.gpu and self.costs.device_s else 0.0
        return device if device > 0 else self.costs.times_s[kid]

    def fast_time(self, kid: int) -> float:
        return self.costs.times_s[kid]

    def rerun(self, kid: int) -> Kernel:
        """The kernel a `Recompute` of kernel `kid` runs (`ir.rerun`)."""
        return self._reruns[kid]

    @cached_property
    def _reruns(self) -> tuple[Kernel, ...]:
        # built once: the formulation and the recompute spec ask for them in their inner loops
        return tuple(rerun_kernel(k) for k in self.graph.kernels)

    def rerun_time(self, kid: int) -> float:
        """Seconds a re-run of kernel `kid` takes: its time, or the share of it that a batch
        norm re-run from its saved statistics takes (`ir.rerun.rerun_share`)."""
        return self.fast_time(kid) * self._rerun_shares[kid]

    def rerun_device_time(self, kid: int) -> float:
        """`device_time` of a re-run of kernel `kid`, priced as `rerun_time`."""
        return self.device_time(kid) * self._rerun_shares[kid]

    @cached_property
    def _rerun_shares(self) -> tuple[float, ...]:
        return tuple(rerun_share(self.graph, k, gpu=self.gpu) for k in self.graph.kernels)

    @cached_property
    def copying(self) -> MemorySystem:
        """The memory system that prices copies: `memory`, with every copy
        `costs.REPLAY_TO_FAST_SLOWDOWN` / `REPLAY_TO_SLOW_SLOWDOWN` times longer, by
        direction, where the plan is priced for CUDA-graph
        replay (`memory` itself, with the link as measured, is what the plan records)."""
        if self.replays:
            return self.memory.with_copies_slower(REPLAY_TO_FAST_SLOWDOWN,
                                                  REPLAY_TO_SLOW_SLOWDOWN)
        return self.memory

    def copy_time(self, tid: int, to_tier: str, mode: str) -> float:
        return self.copying.copy_time(int(self.graph.tensor_bytes[tid]), to_tier, mode)

    def fill_time(self, tid: int) -> float:
        """Seconds a fill kernel takes to write tensor `tid` in fast memory with one value (a
        `Fill` record): its bytes at the fast tier's write bandwidth, on the compute stream."""
        fast = self.memory.fast
        return fast.latency_s + int(self.graph.tensor_bytes[tid]) / fast.write_bw

    def step_time(self, kernel_s: float, copies: Iterable[tuple[int, str]]) -> float:
        """Length of a step: a kernel of `kernel_s` with overlapped copies (tensor, to_tier)."""
        sums: dict[str, float] = {}
        for tid, to_tier in copies:
            for term, value in self.copying.async_terms(int(self.graph.tensor_bytes[tid]),
                                                        to_tier):
                sums[term] = sums.get(term, 0.0) + value
        return max([kernel_s, *sums.values()])

    @cached_property
    def all_fast_time(self) -> float:
        return float(sum(self.costs.times_s))

    def slot_penalties(self, kid: int, *, separable_only: bool = True) -> list[float] | None:
        """Host mode: extra seconds per IO slot when that slot alone is in the slow tier.
        `separable_only`: None unless the kernel's time is separable (t_fast + the sum over
        slow slots); otherwise the per-slot penalties of the bandwidth model, at least 0 (for
        kernels too wide for one-hot IO configurations)."""
        kernel = self.graph.kernels[kid]
        if separable_only and kid in self.costs.measured_placements:
            return None
        base = self.costs.times_s[kid]
        n = len(kernel.io)
        out = []
        for slot in range(n):
            placement = [FAST] * n
            placement[slot] = SLOW
            out.append(self.kernel_time(kid, placement) - base)
        if not separable_only:
            return [max(p, 0.0) for p in out]
        # The documented model is separable when the slow tier is no faster than the fast one;
        # check the all-slow placement so that a different model falls back to one-hot configs.
        everything = self.kernel_time(kid, [SLOW] * n) - base
        if abs(everything - sum(out)) > 1e-9 * max(base, 1e-9):
            return None
        return out


def over_device_note(machine: MachineModel) -> str | None:
    """A GPU plan's budget beyond the memory of the GPU it is priced for: it cannot run so."""
    gpu, budget = machine.costs.target, machine.memory.budget_bytes
    device_bytes = GPU_DEVICE_BYTES.get(gpu)
    if machine.memory.mode != "gpu" or device_bytes is None or budget is None or \
            budget <= device_bytes:
        return None
    return (f"budget: {format_bytes(budget)} is more than the {gpu}'s "
            f"{format_bytes(device_bytes)} of memory: the plan cannot run as planned on it "
            "(give a smaller --fast-mem or --ratio)")
