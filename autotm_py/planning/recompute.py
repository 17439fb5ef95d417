"""Recomputation candidates: which tensors may be dropped and regenerated, where, and what a
regeneration needs (docs/planning.md section 2b).

A tensor t gets a third state beside fast and slow, *absent*: its fast copy is dropped and,
before a later use u, its producer p is re-run (a ``Recompute`` record before kernel u). The
filters that keep the joint ILP small:

- **candidates**: t is an activation that dies within the iteration, its producer p is a
  forward kernel (an ONNX op or a fused forward op, never a backward or optimizer kernel) whose
  outputs are reproducible bit for bit (`plan.NON_REPRODUCIBLE_OPS` never), and p is cheap:
  ``t_p <= ratio * (copy out + copy back of p's candidate outputs)`` (t_p the re-run's time,
  overlapped copies), i.e. re-running costs no more than moving would;
- **regeneration points**: t is regenerated only right before a *backward* use (a user that
  is not a forward kernel: a backward, loss or optimizer kernel), level 0;
- **chains**: a regeneration of t at u needs every input of p's re-run in fast memory at u
  (`ir.rerun`: a training-mode batch norm reads X, its scale and bias and its saved statistics,
  and regenerates only Y). An input that is itself a candidate may be regenerated at u too
  (level 1), and so on while the level stays below `depth`. An input that must be held for a
  regeneration past its last use has its live range extended to u (its *conditional use* at
  u), where the ILP may keep it, read it back, regenerate it or leave it absent if no
  regeneration needs it.

`RecomputeSpec.none(machine)` is the spec without recomputation (move-only plans).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autotm_py.ir.graph import Role
from autotm_py.ir.rules.fused import FUSED_OPS
from autotm_py.memory.tiers import FAST, SLOW
from autotm_py.plan import NON_REPRODUCIBLE_OPS

if TYPE_CHECKING:
    from autotm_py.ir.graph import Kernel, TensorGraph
    from autotm_py.machine import MachineModel


def is_forward(kernel: Kernel) -> bool:
    """A forward kernel: an ONNX op (domain "") or a fused forward op of ours."""
    return kernel.domain == "" or kernel.op_type in FUSED_OPS


def backward_kernels(graph: TensorGraph) -> list[int]:
    """The kernels that are not forward kernels (backward, loss, optimizer), in order."""
    return [k.id for k in graph.kernels if not is_forward(k)]


def backward_users(graph: TensorGraph, tid: int) -> list[int]:
    """The kernels that read tensor `tid` and are not forward kernels."""
    return [u for u in graph.tensors[tid].users if not is_forward(graph.kernels[u])]


def reproducible(kernel: Kernel) -> bool:
    """Whether re-running the kernel gives its outputs bit for bit (no unseeded randomness)."""
    return kernel.op_type not in NON_REPRODUCIBLE_OPS


@dataclass(frozen=True)
class RecomputeSpec:
    """Where each tensor may be regenerated and where a regeneration may need it.

    regen:  tensor -> kernels before which it may be regenerated (its producer re-run);
    needs:  tensor -> kernels before which a regeneration may need it in fast memory (its
            conditional uses; those past its last use extend its live range);
    ends:   per tensor, the last kernel of its (extended) live range;
    groups: (producer, kernel) -> the producer's outputs that may be regenerated there (a
            multi-output producer re-creates all its outputs; these are the ones it keeps)."""

    depth: int
    regen: Mapping[int, frozenset[int]] = field(default_factory=dict)
    needs: Mapping[int, frozenset[int]] = field(default_factory=dict)
    ends: tuple[int, ...] = ()
    groups: Mapping[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def none(cls, machine: MachineModel) -> RecomputeSpec:
        return cls(0, ends=tuple(end for _, end in machine.live_ranges))

    @property
    def active(self) -> bool:
        return bool(self.groups)

    def ranges(self, machine: MachineModel) -> tuple[tuple[int, int], ...]:
        """Live ranges with the extensions."""
        return tuple((birth, end) for (birth, _), end in zip(machine.live_ranges, self.ends,
                                                              strict=True))


def candidates(machine: MachineModel, *, ratio: float | None,
               exclude: Collection[int] = ()) -> frozenset[int]:
    """Tensors that may be dropped and regenerated (module docstring). `ratio` None: no cost
    filter (recompute-only plans, which cannot move instead). `exclude`: tensors kept fast or
    pinned (no decision points)."""
    graph = machine.graph
    skip = set(exclude) | set(machine.pinned) | set(machine.survivors)
    out: set[int] = set()
    for kernel in graph.kernels:
        if not (is_forward(kernel) and reproducible(kernel)):
            continue
        mine = [t for t in machine.rerun(kernel.id).outputs if t not in skip
                and graph.tensors[t].role == Role.ACTIVATION and graph.tensors[t].users]
        if mine and (ratio is None or _cheap(machine, kernel.id, mine, ratio)):
            out.update(mine)
    return frozenset(out)


def _cheap(machine: MachineModel, kid: int, outputs: list[int], ratio: float) -> bool:
    """Re-running kernel `kid` costs at most `ratio` x copying `outputs` out and back."""
    move = sum(machine.copy_time(t, SLOW, "async") + machine.copy_time(t, FAST, "async")
               for t in outputs)
    return machine.rerun_time(kid) <= ratio * move


# Early points per tensor at most: beyond it they lie on a grid (`early_points`).
EARLY_POINTS = 8


def early_points(backward: list[int], first: int, early: int) -> list[int]:
    """The early regeneration points of a tensor whose first backward use is `backward[first]`:
    the backward kernels among the `early` before it, every one when `early` <= EARLY_POINTS,
    else those on a grid of every ceil(early / EARLY_POINTS)-th backward kernel. The grid is
    the same for every tensor, so the regenerations of a long segment can share its points
    (checkpointing's pattern) while each tensor gets at most EARLY_POINTS of them."""
    stride = -(-early // EARLY_POINTS)
    return [backward[i] for i in range(max(first - early, 0), first) if i % stride == 0]


def early_window(graph: TensorGraph, early: int) -> int:
    """W as the points use it: at most half the backward pass. Beyond that W only coarsens
    the grid (points every ceil(W/8) kernels) of a short backward pass: `layers_training(8)`,
    19 backward kernels, plans 2.2x faster with early points at W <= 12 and gains nothing at
    W = 32, whose 4-kernel grid leaves no start 5% better than the plan without."""
    return min(early, len(backward_kernels(graph)) // 2)


def _first_backward_need(machine: MachineModel, cands: frozenset[int]) -> dict[int, int]:
    """Per candidate, its first backward use, or for one with none the earliest such need of
    the candidates made from it (a chain regenerating them starts from it there)."""
    graph = machine.graph
    out: dict[int, int] = {}
    for t in sorted(cands, key=lambda t: graph.tensors[t].producer, reverse=True):  # type: ignore
        own = backward_users(graph, t)
        made = [out[o] for u in graph.tensors[t].users if is_forward(graph.kernels[u])
                for o in graph.kernels[u].outputs if o in out]
        if own or made:
            out[t] = min(own) if own else min(made)
    return out


def recompute_spec(machine: MachineModel, *, depth: int, ratio: float | None,
                   exclude: Collection[int] = (), early: int = 0) -> RecomputeSpec:
    """Regeneration points, conditional uses and extended ranges (module docstring). `early`:
    also backward kernels among the `early` right before each candidate's first backward use
    (`early_points`), so that a chain may be regenerated link by link over several kernels,
    each link kept until its use (as checkpointing re-runs a segment), where one point would
    need a deep chain."""
    graph = machine.graph
    cands = candidates(machine, ratio=ratio, exclude=exclude)
    regen: dict[int, dict[int, int]] = defaultdict(dict)  # tensor -> kernel -> level
    frontier: list[tuple[int, int, int]] = []
    backward = backward_kernels(graph)
    early = early_window(graph, early)
    needed = _first_backward_need(machine, cands) if early else {}
    for t in sorted(cands):
        points = backward_users(graph, t)
        if early and t in needed:
            # a tensor read only in the forward pass (the sum before a ResNet block's ReLU)
            # may also be regenerated where its first descendant with a backward use is,
            # which a chain would reach only past its depth
            first = backward.index(needed[t])
            points += early_points(backward, first, early) + ([] if points else [needed[t]])
        for u in points:
            regen[t][u] = 0
            frontier.append((t, u, 0))
    needs: dict[int, set[int]] = defaultdict(set)
    while frontier:
        t, u, level = frontier.pop()
        producer = machine.rerun(graph.tensors[t].producer)  # type: ignore[arg-type]
        for i in set(producer.inputs):
            needs[i].add(u)
            if i in cands and level + 1 < depth and regen[i].get(u, depth) > level + 1:
                regen[i][u] = level + 1
                frontier.append((i, u, level + 1))
    ends = [max([end, *needs.get(t, ())]) for t, (_, end) in enumerate(machine.live_ranges)]
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for t, points in regen.items():
        for u in points:
            groups[(graph.tensors[t].producer, u)].append(t)  # type: ignore[index]
    return RecomputeSpec(
        depth=depth,
        regen={t: frozenset(p) for t, p in regen.items() if p},
        needs={t: frozenset(u) for t, u in needs.items()},
        ends=tuple(ends),
        groups={k: tuple(sorted(v)) for k, v in sorted(groups.items())},
    )


def fill_candidates(machine: MachineModel, fills: Collection[tuple[str, float]]
                    ) -> dict[int, float]:
    """Tensor id -> value of the known-value tensors (`PlanConfig.fills`, by name) that the
    ILP may drop for free and fill instead of copying (`formulation` family 5): GPU mode only
    (a host-mode kernel may read the slow copy, which a dropped tensor lacks); never a pinned
    or carried tensor, nor one a kernel makes that must outlive the iteration."""
    if not fills or not machine.gpu:
        return {}
    graph = machine.graph
    # written by the iteration (W -> W'); a persistent tensor is its own pair (t, t)
    carried = {t for first, last in machine.steady_pairs if first != last for t in (first, last)}
    by_name = {t.name: t for t in graph.tensors}
    out: dict[int, float] = {}
    for name, value in fills:
        t = by_name.get(name)
        if t is None or t.id in machine.pinned or t.id in carried or not graph.tensor_bytes[t.id]:
            continue
        if t.producer is None or t.id not in machine.survivors:
            out[t.id] = float(value)
    return out
