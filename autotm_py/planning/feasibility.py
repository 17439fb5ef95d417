"""The smallest feasible budget, what it is made of, and what of it a budget cannot hold.

A plan exists from the smallest feasible budget up (`smallest_budget`). Its kernel part is the
largest, over kernels, of what must be in fast memory while the kernel runs: in GPU mode its
placeable inputs and outputs, its workspace (with scratch windows, its window: the workspace,
the outputs torch allocates beside their slots, and slack) and the tensors kept fast for life
that are live there; with the static strategy the whole all-fast peak (nothing moves); in host
mode its workspace. Every budget then gives up, before any tensor, the runtime reserve, the
arena's scratch region, the bytes held back so that the arena's packing fits and the headroom
(`MachineModel.user_terms`).

`Smallest` keeps those parts, so that every face states the same figure (optimize's result
line, inspect's useful budgets, bench rows, the Trainer's error) and says which part does not
fit a given budget (`Smallest.causes`): the kernel's own working set, or the reserve, the
scratch region, the scratch window, the packing's holes or the headroom beside it. Each face
formats it (`Smallest.message`, with the fixes in the face's own terms: `FACES`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from autotm_py.ir.conv_split import (
    CHUNKS_ATTR,
    CONV_GRAD_PARTS,
    RECURRENT_OPS,
    chunked_name,
    chunks_to_fit,
    entry_kernel,
    forward_convs,
    most_chunks,
    part_operands,
    part_origins,
    splittable_kernels,
)
from autotm_py.ir.host_updates import UPDATE_OPS
from autotm_py.ir.training import chunkable_logits_bytes
from autotm_py.units import format_bytes, parse_bytes

if TYPE_CHECKING:
    from autotm_py.ir.graph import TensorGraph
    from autotm_py.machine import MachineModel

# The parts beside the kernel's own bytes, in the order a message names them.
OVERHEADS = ("reserve", "scratch", "window", "margin", "headroom")

# How each face names its fixes: the budget to give, and the option behind each part.
FACES: dict[str, dict[str, str]] = {
    "cli": {
        "budget": "--fast-mem {}",
        "reserve": "--reserve BYTES (or a --memory file with another runtime_reserve_bytes) "
                   "if your runtime keeps less",
        "windows": "--scratch windows (with --arena --placed) gives each scratch of 1 MiB or "
                   "more a window live only while its kernel runs",
        "no_arena": "without an arena (--no-arena)",
        "headroom": "a smaller --headroom",
        "chunks": "--loss-chunks 16",
        "host": "--optimizer-on host",
    },
    "trainer": {
        "budget": "budget='{}'",
        "reserve": "",
        "windows": "mode=RunMode(arena=True, placed=True, replay=True) gives each scratch of "
                   "1 MiB or more a window live only while its kernel runs",
        "no_arena": "without an arena (mode=RunMode(replay=True))",
        "headroom": "",
        "chunks": "loss_chunks=16",
        "host": "optimizer_on='host'",
    },
}


def min_feasible_budget(machine: MachineModel, strategy: str,
                        fixed: frozenset[int] = frozenset(),
                        ranges: Sequence[tuple[int, int]] | None = None) -> tuple[int, int]:
    """(bytes, kernel): the smallest budget of the plan's tensors (`MachineModel.tensor_budget`)
    at which a plan exists, and the kernel forcing it.

    GPU mode: a kernel's placeable inputs, outputs and workspace must all be in fast memory
    (and with the static strategy nothing moves, so the whole all-fast peak must fit). Host
    mode: only workspace must be fast; kernels can read and write the slow tier. Tensors in
    `fixed` (kept fast for life) count wherever they are alive (over `ranges`: the live
    ranges, extended by recomputation). Regenerations never raise it: a plan may always keep
    or move instead. (Recompute-only plans may be infeasible above it: nothing can move.)"""
    n = len(machine.graph.kernels)
    if not n:
        return 0, -1
    if machine.gpu and strategy == "static":
        return machine.peak
    need = kernel_needs(machine, fixed, ranges)
    kid = max(range(n), key=need.__getitem__)
    return need[kid], kid


def kernel_needs(machine: MachineModel, fixed: frozenset[int] = frozenset(),
                 ranges: Sequence[tuple[int, int]] | None = None) -> list[int]:
    """Per kernel, the smallest budget of the plan's tensors at which it can run (the moving
    strategies' rule of `min_feasible_budget`: its workspace, its own inputs and outputs in GPU
    mode, and the tensors in `fixed` alive there)."""
    resident = machine.live_bytes(fixed, ranges)
    return [int(machine.workspace[k]) + _own_bytes(machine, k, fixed) + int(resident[k])
            for k in range(len(machine.graph.kernels))]


def splits_for_budget(machine: MachineModel) -> list[str]:
    """`--split-conv-grads auto`: the split list (`ir.conv_split`) of the kernels a split
    changes (`splittable_kernels`, and the forward convolutions that have workspace) whose own
    need the budget cannot hold, [] where another kernel needs more (no split can make the
    budget fit). A recurrent kernel gets the fewest batch chunks whose
    share of its temporaries leaves its need within the budget, so that a larger budget keeps
    larger, faster chunks; so do a convolution's filter and data parts where the largest of
    them with its workspace (the fused kernel's, measured) still needs more, and a forward
    convolution whose measured workspace is what the budget cannot hold."""
    graph = machine.graph
    convs = [k for k in forward_convs(graph) if machine.workspace[k] > 0]
    needs, budget = kernel_needs(machine), int(machine.tensor_budget or 0)
    over = [k for k in [*splittable_kernels(graph), *convs] if needs[k] > budget]
    if not over or max(needs) > max(needs[k] for k in over):
        return []
    out = []
    for k in over:
        kernel = graph.kernels[k]
        # where the scratch region, not the kernel's own row, holds its workspace: the
        # shapes' default; else what its row leaves for its workspace (a scratch window holds
        # the workspace and the outputs torch allocates: only the first shrinks)
        if machine.workspace[k] <= 0:
            out.append(kernel.name)
            continue
        tape = int(machine.kernel_workspace[k])
        room = max(budget - (needs[k] - tape - _parts_saving(machine, kernel)), 1)
        chunks = chunks_to_fit(graph, kernel, tape, room)
        if chunks > 1 or kernel.op_type in RECURRENT_OPS:
            out.append(chunked_name(kernel.name, chunks))
        elif kernel.op_type in CONV_GRAD_PARTS:  # its parts unchunked (a forward one: as is)
            out.append(kernel.name)
    return out


def refit_chunks(graph: TensorGraph, names: Sequence[str],
                 machine_of: Callable[[Sequence[str]], MachineModel], strategy: str
                 ) -> tuple[list[str], MachineModel, Smallest]:
    """`names` (a split list of `graph`'s kernels, `splits_for_budget`'s) with their batch
    chunks doubled while a chunked kernel still sets the split graph's smallest budget above
    the budget (`machine_of(names)`: the split graph priced): the chunks were fitted to a
    share of the whole kernel's workspace, and a measured chunk may take more (cuDNN's
    workspace on a U-Net's convolution, an H100: 770 MiB whole, 640 MiB for each of 2
    chunks). Returns the list, its machine and its smallest budget."""
    names = list(names)
    while True:
        machine = machine_of(names)
        least = smallest_budget(machine, strategy)
        if machine.tensor_budget is None or least.plan_bytes <= machine.tensor_budget:
            return names, machine, least
        kernel = machine.graph.kernels[least.kernel]
        chunks = int(kernel.attr(CHUNKS_ATTR, 1))
        if chunks <= 1 or chunks >= most_chunks(machine.graph, kernel):
            return names, machine, least
        origin = graph.kernels[part_origins(graph, machine.graph)[least.kernel][0]].name
        names = [chunked_name(origin, 2 * chunks) if entry_kernel(n, graph) == origin else n
                 for n in names]


def _parts_saving(machine: MachineModel, kernel: Any) -> int:
    """The bytes of its inputs and outputs a fused convolution backward kernel's largest part
    does without (0 for a recurrent kernel: its chunks read and write them all)."""
    if kernel.op_type not in CONV_GRAD_PARTS:
        return 0
    largest = max(sum(int(machine.sizes[t]) for t in set(part))
                  for part in part_operands(kernel))
    return machine.io_bytes(kernel.id) - largest


def _own_bytes(machine: MachineModel, kid: int, fixed: frozenset[int]) -> int:
    """GPU mode: the accounted bytes of a kernel's inputs and outputs not kept fast for life
    (those count among the resident ones); host mode: none must be fast."""
    if not machine.gpu:
        return 0
    io = set(machine.graph.kernels[kid].io)
    return machine.io_bytes(kid) - sum(int(machine.sizes[t]) for t in io & fixed)


@dataclass(frozen=True)
class Smallest:
    """The smallest feasible budget (`budget_bytes`, as a user gives it) and its parts.

    The kernel part: `tensors_bytes` (the kernel's placeable inputs and outputs; with the
    static strategy the live bytes at the all-fast peak), `workspace_bytes` (its workspace where
    its row counts it: none in an arena run with a scratch region, which holds it),
    `window_bytes` (with scratch windows, its window beyond the workspace) and `resident_bytes`
    (tensors kept fast for life, live there). Beside it: `reserve_bytes`, `scratch_bytes` (the
    arena's scratch region, set by `scratch_kernel`'s scratch), `margin_bytes` (held back so
    that the arena's packing fits) and the headroom, a share of the budget."""

    budget_bytes: int
    plan_bytes: int  # the kernel part: what the plan's tensors need (`min_feasible_budget`)
    kernel: int
    kernel_name: str
    op_type: str
    rule: str  # gpu | static | host
    tensors_bytes: int
    workspace_bytes: int
    window_bytes: int
    resident_bytes: int
    reserve_bytes: int
    scratch_bytes: int
    scratch_kernel: int | None
    scratch_kernel_name: str | None
    margin_bytes: int
    headroom: float
    windowed: bool  # an arena run with scratch windows (the region holds scratch under 1 MiB)
    memory_name: str
    logits_bytes: int | None  # the plain loss's logits, where they set it (`--loss-chunks`)

    def part(self, key: str) -> int:
        """The bytes of one part: ``kernel`` or one of `OVERHEADS`."""
        if key == "kernel":
            return self.plan_bytes
        if key == "headroom":
            return self.budget_bytes - self._total()
        if key == "window":
            return self.window_bytes
        return int(getattr(self, f"{key}_bytes"))

    def budget_for(self, plan_bytes: int) -> int:
        """The budget at which the plan's tensors have `plan_bytes` beside the same reserve,
        scratch region, packing margin and headroom (`MachineModel.user_terms`)."""
        extra = self.reserve_bytes + self.scratch_bytes + self.margin_bytes
        return math.ceil((plan_bytes + extra) / (1.0 - self.headroom))

    def _total(self, without: str | None = None) -> int:
        """The parts' sum before the headroom, less one of them."""
        total = self.plan_bytes + self.reserve_bytes + self.scratch_bytes + self.margin_bytes
        return total - (self.part(without) if without in ("reserve", "scratch", "margin",
                                                          "window") else 0)

    def without(self, key: str) -> int:
        """The smallest feasible budget without one of `OVERHEADS`."""
        if key == "headroom":
            return self._total()
        return math.ceil(self._total(key) / (1.0 - self.headroom))

    def causes(self, budget: int) -> tuple[str, ...]:
        """What of the smallest feasible budget does not fit `budget`: the overheads whose
        removal alone would let it fit (the packing's margin alone where it is one: the fit
        loop held it back after the plan without it fitted), else all of them together where
        the kernel part alone fits, else () (the kernel's own working set does not fit)."""
        if budget >= self.budget_bytes:
            return ()
        present = [k for k in OVERHEADS if self.part(k) > 0]
        alone = tuple(k for k in present if budget >= self.without(k))
        if alone:
            return ("margin",) if "margin" in alone else alone
        return tuple(present) if budget >= self.plan_bytes else ()

    def message(self, budget: int, face: str = "cli") -> str:
        """One line: the budget, the smallest feasible one with its parts, the kernel forcing
        it and why, what does not fit, and the fix (in `face`'s terms, `FACES`)."""
        hints = FACES[face]
        return (f"infeasible: the budget of {format_bytes(budget)} is below the smallest "
                f"feasible budget of {format_bytes(self.budget_bytes)} ({self.budget_bytes} "
                f"bytes{self._parts_text()}), forced by kernel #{self.kernel} "
                f"{self.kernel_name!r} ({self.op_type}): {self._why()}"
                f"{self._causes_text(budget, hints)}{self._logits_text(hints)}"
                f"{self._update_text(budget, hints)}; give "
                f"{hints['budget'].format(size_at_least(self.budget_bytes))} or more")

    def short(self, budget: int) -> str:
        """The kernel and, where it is no part of the kernel, what does not fit `budget`, for a
        table cell: 'kernel #319 BatchNormGrad; the scratch region (784.50 MiB) does not fit'."""
        causes = self.causes(budget)
        text = f"kernel #{self.kernel} {self.op_type}"
        if not causes:
            return text
        verb = "do" if len(causes) > 1 else "does"
        return f"{text}; {self._named(causes)} {verb} not fit"

    def _named(self, keys: Sequence[str]) -> str:
        """'the runtime reserve (68.00 MiB) and the headroom (268.89 MiB)'."""
        return " and ".join(f"the {_PART_NAMES[k]} ({format_bytes(self.part(k))})" for k in keys)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def _parts_text(self) -> str:
        parts = [f"{format_bytes(self.plan_bytes)} for the kernel"]
        parts += [f"{format_bytes(self.part(k))} {_PART_NAMES[k]}" for k in OVERHEADS
                  if self.part(k) > 0 and k != "window"]
        return "" if len(parts) == 1 else ": " + " + ".join(parts)

    def _why(self) -> str:
        if self.rule == "static":
            return "the static strategy moves nothing, so the whole footprint must fit"
        if self.rule == "host":
            return "its workspace must be in fast memory"
        own = "scratch window" if self.window_bytes else "workspace"
        if self.scratch_bytes and not self.workspace_bytes and not self.window_bytes:
            return ("its inputs and outputs must be in fast memory together (the scratch "
                    "region holds what it allocates)")
        return f"its inputs, outputs and {own} must be in fast memory together"

    def _causes_text(self, budget: int, hints: dict[str, str]) -> str:
        causes = self.causes(budget)
        if not causes and self._mostly_reserve():
            # not what alone does not fit (the tensors do not either), but most of it
            return (f"; {format_bytes(self.reserve_bytes)} of it is {self._reserve()}, the "
                    f"model's tensors need only {format_bytes(self.plan_bytes)}"
                    + (f": {hints['reserve']}" if hints["reserve"] else ""))
        if not causes:
            return ""
        if len(causes) > 1 and all(budget < self.without(k) for k in causes):
            return (f"; the kernel's {format_bytes(self.plan_bytes)} fit, not with "
                    f"{self._named(causes)} beside them")
        return "".join(self._cause(k, hints) for k in causes)

    def _cause(self, key: str, hints: dict[str, str]) -> str:
        size = format_bytes(self.part(key))
        what = {
            "reserve": f"{self._reserve()}, {size}; the model's tensors need only "
                       f"{format_bytes(self.plan_bytes)}",
            "scratch": f"the arena's scratch region, {size}: the largest scratch of a kernel "
                       f"without a window (kernel #{self.scratch_kernel} "
                       f"{self.scratch_kernel_name!r}: its workspace and the outputs torch "
                       "allocates), kept for the whole iteration",
            "window": f"the kernel's scratch window beyond its workspace, {size}: the outputs "
                      "torch allocates beside their slots (copied there) and 1 MiB of slack",
            "margin": f"the {size} held back so that the arena's packing fits (the holes "
                      "between its buffers)",
            "headroom": f"the headroom, {size} ({self.headroom:.0%} of the budget) left free "
                        "for the allocator",
        }[key]
        fix = self._fix(key, hints)
        return f"; what does not fit is {what}" + (f": {fix}" if fix else "")

    def _fix(self, key: str, hints: dict[str, str]) -> str:
        """What the face offers for one part, beside a larger budget."""
        if key == "scratch":
            windows = "" if self.windowed else f"{hints['windows']}; "
            return f"{windows}{hints['no_arena']} a workspace counts only while its kernel runs"
        if key == "window":
            return f"{hints['no_arena']} those outputs need no second copy"
        return hints.get(key, "")

    def _reserve(self) -> str:
        return (f"the runtime reserve of memory system {self.memory_name!r} (fast memory the "
                "runtime keeps for itself: torch's cuBLAS workspaces on a GPU)")

    def _logits_text(self, hints: dict[str, str]) -> str:
        """Where a language model's plain loss sets it: `--loss-chunks` lifts it."""
        if self.logits_bytes is None:
            return ""
        return (f"; the loss's logits ({format_bytes(self.logits_bytes)}) set it: "
                f"{hints['chunks']} computes the loss over blocks of tokens and never holds "
                "them whole (docs/training.md)")

    def _mostly_reserve(self) -> bool:
        """The runtime reserve is at least the kernel part (what the model's tensors need)."""
        return self.reserve_bytes >= self.plan_bytes > 0

    def _update_text(self, budget: int, hints: dict[str, str]) -> str:
        """Where an optimizer update on the GPU sets it, with its own bytes (not the reserve
        or another overhead): on the host its state stays there."""
        if self.op_type not in UPDATE_OPS or self.causes(budget) or self._mostly_reserve():
            return ""
        return (f"; an optimizer update sets it (the weight, its gradient and its optimizer "
                f"state together): {hints['host']} runs the updates on the host's cores, "
                "and fast memory then holds only what the GPU's kernels read "
                "(docs/training-loop.md)")


_PART_NAMES = {"reserve": "runtime reserve", "scratch": "scratch region",
               "window": "scratch window", "margin": "held back for the arena's packing",
               "headroom": "headroom"}


def smallest_budget(machine: MachineModel, strategy: str, fixed: frozenset[int] = frozenset(),
                    ranges: Sequence[tuple[int, int]] | None = None) -> Smallest:
    """The smallest feasible budget of `machine` for `strategy` and its parts (`Smallest`;
    `fixed`, `ranges`: `min_feasible_budget`'s)."""
    need, kid = min_feasible_budget(machine, strategy, fixed, ranges)
    graph = machine.graph
    rule = "host" if not machine.gpu else "static" if strategy == "static" else "gpu"
    row = int(machine.workspace[kid]) if kid >= 0 else 0
    workspace = min(row, int(machine.kernel_workspace[kid])) if kid >= 0 else 0
    tensors = need - row if rule == "static" else \
        _own_bytes(machine, kid, fixed) if kid >= 0 else 0
    region = _region_kernel(machine)
    return Smallest(
        budget_bytes=machine.user_terms(need), plan_bytes=need, kernel=kid,
        kernel_name=graph.kernels[kid].name if kid >= 0 else "",
        op_type=graph.kernels[kid].op_type if kid >= 0 else "", rule=rule,
        tensors_bytes=tensors, workspace_bytes=workspace, window_bytes=row - workspace,
        resident_bytes=need - row - tensors, reserve_bytes=machine.reserve_bytes,
        scratch_bytes=machine.scratch_reserve, scratch_kernel=region,
        scratch_kernel_name=graph.kernels[region].name if region is not None else None,
        margin_bytes=machine.arena_margin, headroom=machine.headroom,
        windowed=machine.windowed, memory_name=machine.memory.name,
        logits_bytes=chunkable_logits_bytes(graph, kid) if kid >= 0 else None)


def _region_kernel(machine: MachineModel) -> int | None:
    """The kernel whose scratch sets the arena's scratch region (None: no region)."""
    if not machine.scratch_reserve:
        return None
    return int(np.where(machine.windows, 0, machine.scratch).argmax())


def size_at_least(n: int) -> str:
    """A size to give as an option, at least `n` bytes: '2.37GiB' for 2.3633 GiB (the printed
    figure rounds to the nearest, which may be below it)."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            hundredths = math.ceil(n * 100 / scale)
            while parse_bytes(f"{hundredths / 100:.2f}{unit}") < n:
                hundredths += 1
            return f"{hundredths / 100:.2f}{unit}"
    return f"{n}B"
