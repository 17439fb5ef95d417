"""Decision points ("gadgets"): the kernels at which a tensor may change tier.

A tensor's location can change only at its gadgets (AutoTM section 1.2); between two gadgets
it stays where it is. Each gadget carries how a copy there is made:

- ``read``: a copy into fast memory at the gadget, before the kernel (sync) or beside it
  (async); then the tensor is in fast memory while the kernel runs;
- ``write``: an eviction that first writes the tensor to the slow tier, after the kernel (sync)
  or beside it (async); dropping a fast copy whose slow copy is valid is free at any gadget.

Strategies are flags of the same rule:

- static: the birth kernel only (producer, or kernel 0 for given tensors): one home for life;
- sync: the birth kernel and every user; blocking reads before a user, blocking writes after
  the producer or a user;
- async: sync plus, within `window` kernels, overlapped reads before each user and overlapped
  writes after each use (producer included), at kernels that do not touch the tensor.

With recomputation (`recompute.RecomputeSpec`), a tensor also has gadgets at its conditional
uses (kernels before which a regeneration may need it: sync reads there, async reads in the
windows before them, no writes), `regen` marks the gadgets before which it may be regenerated,
and from gadget `discard_from` on its fast copy may be dropped with no copy anywhere (absent:
at once for a candidate, after its last use for a tensor whose range a regeneration extends).
`moves=False` (recompute-only plans) removes every read and write.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotm_py.machine import MachineModel
    from autotm_py.planning.recompute import RecomputeSpec

NONE, SYNC, ASYNC = 0, 1, 2
MODE_NAMES = {SYNC: "sync", ASYNC: "async"}


@dataclass(frozen=True, slots=True)
class TensorGadgets:
    """The decision points of one placeable tensor, in kernel order."""

    tensor: int
    kernels: tuple[int, ...]
    read: tuple[int, ...]  # NONE | SYNC | ASYNC per gadget
    write: tuple[int, ...]
    io: tuple[bool, ...]  # the gadget's kernel reads or writes the tensor
    given: bool  # no producer: starts where the plan's `initial` says
    survives: bool  # must exist after the last kernel: the path ends in an end layer
    may_start_slow: bool  # given and starting in slow, or produced straight into slow
    fixed: bool = False  # kept in fast memory for life (a small tensor, see `small_tensors`)
    regen: tuple[bool, ...] = ()  # may be regenerated (its producer re-run) before the gadget
    # a sync read besides the gadget's async one (a kernel in a read window that a regeneration
    # may need the tensor for: the async copy would arrive after the re-run)
    sync_read: tuple[bool, ...] = ()
    discard_from: int = -1  # first gadget after which it may become absent (-1: never)
    last: int = -1  # last kernel of its (extended) live range
    # the host's tensors (`ir.host_updates`): a fed weight starts in the slow tier (the host
    # wrote it there), a drained gradient ends there (the host reads it)
    starts_slow: bool = False
    ends_slow: bool = False

    def regenerates(self, j: int) -> bool:
        return bool(self.regen) and self.regen[j]

    def sync_reads(self, j: int) -> bool:
        """A sync read at gadget j besides its async one."""
        return bool(self.sync_read) and self.sync_read[j]

    def reads(self, j: int) -> bool:
        return self.read[j] != NONE or self.sync_reads(j)


def tensor_gadgets(machine: MachineModel, strategy: str, window: int,
                   candidates: int | None = None,
                   fixed: frozenset[int] = frozenset(), *,
                   recompute: RecomputeSpec | None = None,
                   moves: bool = True) -> list[TensorGadgets | None]:
    """Gadgets of every tensor (None for pinned tensors, which never move). `candidates`
    (async): keep only that many kernels per window, the longest ones (see `_add_windows`).
    `fixed`: tensors that stay in fast memory for life (no decision points but their birth).
    `recompute`: regeneration points and conditional uses; `moves`: False for plans that
    copy nothing between tiers."""
    out: list[TensorGadgets | None] = []
    for t in machine.graph.tensors:
        last = recompute.ends[t.id] if recompute is not None else machine.live_ranges[t.id][1]
        if t.id in machine.pinned:
            out.append(None)
        elif t.id in fixed:
            birth = machine.live_ranges[t.id][0]
            out.append(TensorGadgets(t.id, (birth,), (NONE,), (NONE,), (True,),
                                     t.producer is None, t.id in machine.survivors, False, True,
                                     last=last))
        else:
            g = _one(machine, t.id, strategy, window, candidates, recompute)
            out.append(g if moves else _without_moves(machine, g))
    return out


def _without_moves(machine: MachineModel, g: TensorGadgets) -> TensorGadgets:
    """No reads and writes: a tensor stays where it starts (host mode: a given tensor may
    still start in the slow tier and be read there)."""
    none = (NONE,) * len(g.kernels)
    return replace(g, read=none, write=none, sync_read=(),
                   may_start_slow=g.may_start_slow and g.given and not machine.gpu)


def small_tensors(machine: MachineModel, share: float,
                  ranges: Sequence[tuple[int, int]] | None = None) -> frozenset[int]:
    """The smallest tensors whose sizes, summed over all of them alive at once, never exceed
    `share` of the budget. Kept in fast memory for life, they cost at most that share of the
    budget, while giving them decision points would add most of the ILP's variables (a
    training graph has thousands of statistics, biases and small weights). Carried pairs are
    kept together. `ranges`: live ranges to count them over (extended by recomputation)."""
    if machine.tensor_budget is None or share <= 0:
        return frozenset()
    cap = share * machine.tensor_budget
    host = machine.fed | machine.drained  # must move: never fixed in fast memory
    order = sorted((t for t in range(len(machine.graph.tensors))
                    if t not in machine.pinned and t not in host),
                   key=lambda t: machine.sizes[t])
    lo, hi = 0, len(order)  # the largest prefix of `order` whose live peak fits in `cap`
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _live_peak(machine, order[:mid], ranges) <= cap:
            lo = mid
        else:
            hi = mid - 1
    chosen = set(order[:lo])
    for first, last in machine.graph.carried:
        if (first in chosen) != (last in chosen):
            chosen.discard(first)
            chosen.discard(last)
    return frozenset(chosen)


def _live_peak(machine: MachineModel, tensors: list[int],
               ranges: Sequence[tuple[int, int]] | None) -> int:
    return int(machine.live_bytes(tensors, ranges).max()) if machine.graph.kernels else 0


@dataclass
class _Draft:
    """One tensor's gadgets as `_one` gathers them: the read and write mode at each kernel,
    the kernels before which it may be regenerated, its conditional uses (kernels before which
    a regeneration may need it), and those of them that keep an async read besides a sync
    one."""

    read: dict[int, int]
    write: dict[int, int]
    regen: frozenset[int] = frozenset()
    cond: list[int] = field(default_factory=list)
    both: set[int] = field(default_factory=set)


def _one(machine: MachineModel, tid: int, strategy: str, window: int,
         candidates: int | None, recompute: RecomputeSpec | None) -> TensorGadgets:
    t = machine.graph.tensors[tid]
    birth, end = machine.live_ranges[tid]
    uses = set(t.users) | ({t.producer} if t.producer is not None else set())
    if strategy == "static":  # the birth kernel only, and no moves
        return _finished(machine, tid, strategy, _Draft({birth: NONE}, {birth: NONE}), end,
                         recompute, uses)
    draft = _Draft({birth: NONE}, {birth: SYNC if t.producer is not None else NONE})
    if recompute is not None:
        draft.regen = recompute.regen.get(tid, frozenset())
        draft.cond = sorted(recompute.needs.get(tid, frozenset()) - uses)
    for u in t.users:
        draft.read[u] = SYNC
        draft.write[u] = SYNC
    if strategy == "async":
        times = machine.costs.times_s
        pick = lambda ks: _longest(ks, times, candidates)  # noqa: E731
        _add_windows(draft.read, draft.write, uses, t.users, (birth, end), window, pick)
        _add_read_windows(draft.read, draft.write, uses, draft.cond, birth, window, pick)
    _add_recompute_points(draft, uses)
    return _finished(machine, tid, strategy, draft, end, recompute, uses)


def _add_recompute_points(draft: _Draft, uses: set[int]) -> None:
    """Gadgets at the conditional uses and at the early regeneration points."""
    read, write = draft.read, draft.write
    for u in draft.cond:  # a sync read may bring it back for a regeneration
        if read.get(u, NONE) == NONE:
            read[u] = SYNC
        write.setdefault(u, NONE)
    for u in draft.regen - uses:  # early regeneration points: a gadget with no move
        read.setdefault(u, NONE)
        write.setdefault(u, NONE)
    # keeps the async read of move-only plans
    draft.both = {u for u in draft.cond if read[u] == ASYNC}


def _finished(machine: MachineModel, tid: int, strategy: str, draft: _Draft, end: int,
              recompute: RecomputeSpec | None, uses: set[int]) -> TensorGadgets:
    """The tensor's gadgets from their draft, in kernel order."""
    kernels = tuple(sorted(draft.read.keys() | draft.write.keys()))
    read, write, regen, both = draft.read, draft.write, draft.regen, draft.both
    return TensorGadgets(
        tensor=tid,
        kernels=kernels,
        read=tuple(read.get(k, NONE) for k in kernels),
        write=tuple(write.get(k, NONE) for k in kernels),
        io=tuple(k in uses for k in kernels),
        given=machine.graph.tensors[tid].producer is None,
        survives=tid in machine.survivors,
        may_start_slow=_may_start_slow(machine, tid, strategy),
        regen=tuple(k in regen for k in kernels),
        sync_read=tuple(k in both for k in kernels) if both else (),
        discard_from=_discard_from(kernels, end, bool(regen), bool(draft.cond)),
        last=recompute.ends[tid] if recompute is not None else end,
        starts_slow=tid in machine.fed,
        ends_slow=tid in machine.drained,
    )


def _may_start_slow(machine: MachineModel, tid: int, strategy: str) -> bool:
    """Whether the tensor may be given in the slow tier or produced straight into it: any
    tensor in host mode, a given one on a GPU, none with GPU static."""
    # GPU static has no moves at all and kernels need fast IO: everything stays fast.
    given = machine.graph.tensors[tid].producer is None
    return (given or not machine.gpu) and not (machine.gpu and strategy == "static")


def _discard_from(kernels: tuple[int, ...], end: int, candidate: bool, extended: bool) -> int:
    """The first gadget after which the tensor may be absent: any gadget for a tensor that may
    be regenerated; its last use for one whose range a regeneration extends; else never."""
    if candidate:
        return 0
    if extended:
        return kernels.index(end) if end in kernels else -1
    return -1


def _add_windows(read: dict[int, int], write: dict[int, int], uses: set[int],
                 users: tuple[int, ...], live: tuple[int, int], window: int,
                 pick: Callable[[list[int]], list[int]]) -> None:
    """Overlapped reads within `window` kernels before each user, overlapped writes within
    `window` kernels after each use, at kernels that neither read nor write the tensor
    (`pick` may thin each window out)."""
    birth, end = live
    for u in users:
        for k in pick([k for k in range(max(birth, u - window), u) if k not in uses]):
            read[k] = ASYNC
            write.setdefault(k, NONE)
    for u in sorted(uses):
        for k in pick([k for k in range(u + 1, min(end, u + window) + 1) if k not in uses]):
            write[k] = ASYNC
            read.setdefault(k, NONE)


def _add_read_windows(read: dict[int, int], write: dict[int, int], uses: set[int],
                      cond: Sequence[int], birth: int, window: int,
                      pick: Callable[[list[int]], list[int]]) -> None:
    """Overlapped reads within `window` kernels before each conditional use (only adding
    decision points: the move-only gadgets stay as they are, so every move-only plan remains a
    point of the model with recomputation)."""
    for u in cond:
        for k in pick([k for k in range(max(birth, u - window), u) if k not in uses]):
            if read.get(k, NONE) == NONE:
                read[k] = ASYNC
            write.setdefault(k, NONE)


def _longest(kernels: list[int], times: Sequence[float], keep: int | None) -> list[int]:
    """The `keep` longest kernels of a window (all when `keep` is None): a copy hides behind
    one kernel, so the long ones are where overlap pays; the ILP shrinks accordingly."""
    if keep is None or len(kernels) <= keep:
        return kernels
    return sorted(kernels, key=lambda k: -times[k])[:keep]
