"""The placement ILP in PuLP: one builder, strategies as flags, one function per family.

Notation (docs/planning.md writes it out): x_e in {0,1} is the flow on edge e of a tensor's
location graph (`paths.py`); D(t,j) and A(t,j) are sums of x saying "t is in fast memory during
gadget j" and "after gadget j"; R(t,k) is D or A of the last gadget of t at or before kernel k.
Units: times in milliseconds, sizes in MiB (exact multiples of 1/2048 after 512-byte alignment),
so coefficients stay within a few orders of magnitude.

Families, in build order:
  (1) paths       flow conservation: each tensor takes one source-to-sink path;
  (2) steady      start tier of W = end tier of W' for carried pairs (W -> W');
  (3) capacity    one row per kernel: U_k = sum_t size_t R(t,k), U_k + workspace_k <= budget,
                  written as U_k - U_{k-1} = (changes at k), so each tensor adds O(gadgets) terms;
  (4) kernel time T_k = t_k (GPU) or t_k + sum of slot penalties for slow IO (host, separable),
                  or one-hot IO configurations with marginal rows (host, measured tables);
  (5) moves       sync reads/writes add their copy time; async ones feed the epigraph (a
                  spread read: its shares over the kernels until its use, `read_shares`);
                  a known-value tensor (`fills`) is written out for nothing and read back
                  by a fill kernel on the compute stream (its fill time);
  (6) epigraph    y_k >= T_k and y_k >= each async term sum of kernel k;
  (7) objective   sum_k (y_k or T_k) + sync copy times + regeneration times;
  (8) regeneration (with recomputation) z_{p,u}: producer p re-run before kernel u; each kept
                  output's REGEN edge <= z; every input of p in fast memory at u (D >= z); the
                  re-run's time t_p z; its memory (3b): U_u + ws_p z + its outputs not kept
                  <= budget.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pulp

from autotm_py.memory.accounting import ALIGN_BYTES
from autotm_py.memory.tiers import FAST, SLOW
from autotm_py.planning.gadgets import ASYNC, SYNC, tensor_gadgets
from autotm_py.planning.paths import (
    F0,
    READ,
    SOURCE,
    SYNC_READ,
    WRITE,
    TensorPaths,
    build_paths,
)
from autotm_py.planning.recompute import RecomputeSpec

if TYPE_CHECKING:
    from autotm_py.machine import MachineModel

MS = 1e3  # seconds -> objective units (milliseconds)
MIB = 1.0 / 2**20  # bytes -> capacity units
MAX_ONE_HOT_TENSORS = 8  # beyond this a measured kernel uses its separable model

Expr = dict[Any, float]


def _add(expr: Expr, var: Any, coef: float) -> None:
    expr[var] = expr.get(var, 0.0) + coef


@dataclass
class Formulation:
    """The ILP of one (model, strategy, window) and the maps needed to decode it."""

    machine: MachineModel
    strategy: str
    window: int
    candidates: int | None = None
    fixed: frozenset[int] = frozenset()  # kept in fast memory: constants, no variables
    recompute: RecomputeSpec | None = None  # regeneration points; None: move-only
    moves: bool = True  # False: recompute-only (no copies between tiers)
    # price an async read over the kernels until its tensor's next use (copies join at their
    # use) instead of against the one kernel it is issued beside (AutoTM's step join)
    spread_reads: bool = False
    # price an async write over the kernels after it until they cover the copy, its source
    # holding its fast memory until then (the copy runs on beside them; `write_span`)
    spread_writes: bool = False
    # (tensor, gadget layer) of a spread async write -> the kernels it runs beside and their
    # shares of its copy time (`write_span`); decode frees the source after the last of them
    write_spans: dict[tuple[int, int], tuple[tuple[int, float], ...]] = \
        field(default_factory=dict)
    # tensors a value profile found all zero or one constant -> that value
    # (`recompute.fill_candidates`): dropped for free and filled again instead of copied
    fills: Mapping[int, float] = field(default_factory=dict)
    prob: pulp.LpProblem = field(default_factory=lambda: pulp.LpProblem("autotm", pulp.LpMinimize))
    paths: list[TensorPaths | None] = field(default_factory=list)
    x: list[list[Any]] = field(default_factory=list)  # edge variables per tensor
    kernel_time: dict[int, tuple[float, Expr]] = field(default_factory=dict)  # seconds
    async_terms: dict[int, dict[str, Expr]] = field(default_factory=dict)  # seconds
    objective: Expr = field(default_factory=dict)  # milliseconds
    capacity: list[Any] = field(default_factory=list)  # U_k per kernel (MiB)
    capacity_constant: list[float] = field(default_factory=list)  # fixed tensors' changes at k
    # (producer, kernel) -> (z: its variable, or None when it is the one output's REGEN edge,
    # {output: REGEN edge variable})
    regen: dict[tuple[int, int], tuple[Any, dict[int, Any]]] = field(default_factory=dict)
    # (kernel u, row 3b): the memory of each re-run before u (`segments` checks starts on it)
    regen_memory: list[tuple[int, Any]] = field(default_factory=list)
    epigraph: dict[int, Any] = field(default_factory=dict)  # y_k (ms)
    configs: dict[int, tuple[list[int], list[tuple[bool, ...]], list[Any]]] = \
        field(default_factory=dict)  # kernel -> (tensors, configurations, c variables)
    constant_var: Any = None  # the constant part of the objective, as a variable fixed at 1
    objective_constant: float = 0.0
    n_rows: int = 0
    n_vars: int = 0
    build_s: float = 0.0

    @property
    def name(self) -> str:
        """The plan family's name (`PlanConfig.plan_name`)."""
        if not self.moves:
            return "recompute-only"
        return self.strategy + ("+recompute" if self.recompute is not None else "")

    # ---- helpers -------------------------------------------------------------------------
    def var(self, name: str, low: float | None = 0, up: float | None = 1,
            binary: bool = True) -> Any:
        self.n_vars += 1
        return self.prob.add_variable(name, low, up, pulp.LpBinary if binary else
                                      pulp.LpContinuous)

    def row(self, expr: Expr, sense: int, rhs: float) -> pulp.LpConstraint:
        terms = [(v, c) for v, c in expr.items() if c != 0.0]
        self.n_rows += 1
        row = pulp.LpConstraint(pulp.LpAffineExpression(terms), sense, f"r{self.n_rows}", rhs)
        self.prob.addConstraint(row)
        return row

    def flows(self, tid: int, edge_ids: tuple[int, ...]) -> Expr:
        """The sum of the given edges' flows of tensor `tid` as an expression."""
        xs = self.x[tid]
        return {xs[i]: 1.0 for i in edge_ids}

    def residency_at(self, tid: int, kid: int) -> Expr:
        """R(t, k) for a kernel k in the live range of t."""
        p = self.paths[tid]
        assert p is not None
        return self.flows(tid, residency_edges(p, kid))


def residency_edges(p: TensorPaths, kid: int) -> tuple[int, ...]:
    """Edges whose flow is R(t, k): during the gadget at k, else after the last gadget before
    k; after its last gadget a tensor that dies stays where it was until its last use."""
    kernels = p.gadgets.kernels
    j = bisect.bisect_right(kernels, kid) - 1
    if kernels[j] == kid or (j == len(kernels) - 1 and not p.gadgets.survives):
        return p.during[j]
    return p.after[j]


def build(machine: MachineModel, strategy: str, window: int, candidates: int | None = None,
          fixed: frozenset[int] = frozenset(), *, recompute: RecomputeSpec | None = None,
          moves: bool = True, spread_reads: bool = False, spread_writes: bool = False,
          fills: Mapping[int, float] | None = None) -> Formulation:
    """Build the ILP: every family below, in order, then the objective. `fixed` tensors stay
    in fast memory (`gadgets.small_tensors`): they enter as constants. `recompute`: where
    tensors may be regenerated (None: move-only); `moves=False`: no copies (recompute-only);
    `spread_reads`: async reads priced over the kernels until their use (`read_shares`), else
    against the kernel they are issued beside (AutoTM); `spread_writes`: async writes priced
    over the kernels after them until those cover the copy, holding the source's memory as
    long (`write_span`). `fills`: known-value tensors, filled
    instead of copied (family 5)."""
    started = time.perf_counter()
    f = Formulation(machine, strategy, window, candidates, fixed, recompute, moves,
                    spread_reads=spread_reads, spread_writes=spread_writes,
                    fills=dict(fills or {}))
    add_paths(f)
    add_steady_state(f)
    add_capacity(f)
    add_kernel_times(f)
    add_moves(f)
    add_epigraph(f)
    add_regeneration(f)
    set_objective(f)
    f.build_s = time.perf_counter() - started
    return f


def last_kernel(f: Formulation, tid: int) -> int:
    """The last kernel of a tensor's live range, extended by the regenerations that may need
    it."""
    return f.recompute.ends[tid] if f.recompute is not None else f.machine.live_ranges[tid][1]


# ---- (1) paths ---------------------------------------------------------------------------
def add_paths(f: Formulation) -> None:
    """Flow conservation (AutoTM 1.5.1): out(SOURCE) = 1; in(v) = out(v) at inner vertices;
    in(v) >= out(v) at terminal ones (the path may end there)."""
    machine = f.machine
    carried_ends = {z for _, z in machine.steady_pairs}
    for g in tensor_gadgets(machine, f.strategy, f.window, f.candidates, f.fixed,
                            recompute=f.recompute, moves=f.moves):
        if g is None or g.fixed:
            f.paths.append(None)
            f.x.append([])
            continue
        p = build_paths(g, gpu=machine.gpu, carried_end=g.tensor in carried_ends)
        xs = [f.var(f"x{g.tensor}_{i}") for i in range(len(p.edges))]
        f.paths.append(p)
        f.x.append(xs)
        balance: dict[int, Expr] = defaultdict(dict)
        for e, v in zip(p.edges, xs, strict=True):
            _add(balance[e.src], v, -1.0)
            _add(balance[e.dst], v, 1.0)
        f.row({v: -c for v, c in balance.pop(SOURCE).items()}, pulp.LpConstraintEQ, 1)
        for vertex, expr in balance.items():
            terminal = vertex in p.terminal
            if terminal and all(c > 0 for c in expr.values()):
                continue  # only in-edges: nothing to conserve
            f.row(expr, pulp.LpConstraintGE if terminal else pulp.LpConstraintEQ, 0)


# ---- (2) steady state --------------------------------------------------------------------
def add_steady_state(f: Formulation) -> None:
    """x(SOURCE -> k of W) = flow into end vertex k of W', for k in {F0, S}: the next
    iteration starts each carried tensor where this one leaves it (one tier, no F1)."""
    for first, last in f.machine.steady_pairs:
        p_first, p_last = f.paths[first], f.paths[last]
        if p_first is None or p_last is None:
            continue  # pinned or fixed: both ends fast (`small_tensors` keeps pairs together)
        for kind, edge in p_first.start.items():
            expr = f.flows(first, (edge,))
            for v, c in f.flows(last, p_last.end_in.get(kind, ())).items():
                _add(expr, v, -c)
            f.row(expr, pulp.LpConstraintEQ, 0)


# ---- (3) capacity ------------------------------------------------------------------------
def add_capacity(f: Formulation) -> None:
    """One row per kernel k: U_k + workspace_k <= budget, U_k = sum_t size_t * R(t,k).

    U_k is a continuous variable chained as U_k = U_{k-1} + (what changes at k): a tensor's
    residency changes only at its gadgets, births and deaths, so the matrix stays sparse.
    The LP relaxation equals that of the dense rows (the chain is a change of variables)."""
    machine = f.machine
    if machine.tensor_budget is None:
        return
    n = len(machine.graph.kernels)
    changes: list[Expr] = [{} for _ in range(n + 1)]
    constant = [0.0] * (n + 1)  # fixed tensors: born and freed in fast memory
    for tid, p in enumerate(f.paths):
        size = float(machine.sizes[tid]) * MIB
        if p is not None and size > 0:
            _residency_changes(f, tid, p, size, changes)
            _write_holds(f, tid, p, size, changes)
        elif tid in f.fixed:
            start, end = machine.live_ranges[tid][0], last_kernel(f, tid)
            constant[start] += size
            constant[end + 1] -= 0.0 if tid in machine.survivors else size
    # sums of aligned sizes are multiples
    budget = machine.tensor_budget // ALIGN_BYTES * ALIGN_BYTES
    prev = None
    for k in range(n):
        room = max(budget - int(machine.workspace[k]), 0) * MIB
        u = f.var(f"U{k}", 0, room, binary=False)
        expr = {u: 1.0}
        if prev is not None:
            expr[prev] = -1.0
        for v, c in changes[k].items():
            _add(expr, v, -c)
        f.row(expr, pulp.LpConstraintEQ, constant[k])
        f.capacity.append(u)
        prev = u
    f.capacity_constant = constant[:n]


def _residency_changes(f: Formulation, tid: int, p: TensorPaths, size: float,
                       changes: list[Expr]) -> None:
    """Add size * (R(t,k) - R(t,k-1)) at every kernel k where R(t, .) may change."""
    previous: tuple[int, ...] = ()
    for k, edges in residency_pieces(p, p.gadgets.last):
        for v in f.flows(tid, edges):
            _add(changes[k], v, size)
        for v in f.flows(tid, previous):
            _add(changes[k], v, -size)
        previous = edges


def _write_holds(f: Formulation, tid: int, p: TensorPaths, size: float,
                 changes: list[Expr]) -> None:
    """A spread async write's source keeps its fast memory to the end of its span: size * x
    from the kernel after its gadget to the span's last kernel (the write edge leaves the
    tensor slow-only, so its residency has let the memory go)."""
    if not f.spread_writes or tid in f.fills:
        return
    for e, v in zip(p.edges, f.x[tid], strict=True):
        if e.kind != WRITE or p.gadgets.write[e.layer] != ASYNC:
            continue
        span = write_span(f, tid, p, e.layer)
        issue, last = p.gadgets.kernels[e.layer], span[-1][0]
        if last > issue:
            _add(changes[issue + 1], v, size)
            _add(changes[last + 1], v, -size)


def residency_pieces(p: TensorPaths, last: int) -> list[tuple[int, tuple[int, ...]]]:
    """R(t, .) as (first kernel, edges) pieces over the live range ending at kernel `last`,
    closed by (last + 1, ()) when the tensor dies there."""
    kernels = p.gadgets.kernels
    pieces: list[tuple[int, tuple[int, ...]]] = []
    for j, k in enumerate(kernels):
        pieces.append((k, p.during[j]))
        if j + 1 < len(kernels):
            if k + 1 < kernels[j + 1]:
                pieces.append((k + 1, p.after[j]))
        elif p.gadgets.survives and k < last:
            pieces.append((k + 1, p.after[j]))
    if not p.gadgets.survives:
        pieces.append((last + 1, ()))
    return pieces


# ---- (4) kernel times --------------------------------------------------------------------
def add_kernel_times(f: Formulation) -> None:
    """T_k in seconds as (constant, expression). GPU: t_k. Host: t_k + sum over IO slots of
    penalty_slot * (1 - R(t_slot, k)) when separable, else the one-hot configurations."""
    machine = f.machine
    for kid, kernel in enumerate(machine.graph.kernels):
        base = machine.fast_time(kid)
        if machine.gpu or all(f.paths[t] is None for t in kernel.io):
            f.kernel_time[kid] = (base, {})
            continue
        penalties = machine.slot_penalties(kid)
        distinct = {t for t in kernel.io if f.paths[t] is not None}
        if penalties is None and len(distinct) <= MAX_ONE_HOT_TENSORS:
            f.kernel_time[kid] = add_io_configs(f, kid, sorted(distinct))
            continue
        penalties = penalties or machine.slot_penalties(kid, separable_only=False)
        const, expr = base, {}
        for slot, tid in enumerate(kernel.io):
            if f.paths[tid] is None or penalties[slot] == 0.0:
                continue
            const += penalties[slot]
            for v, c in f.residency_at(tid, kid).items():
                _add(expr, v, -penalties[slot] * c)
        f.kernel_time[kid] = (const, expr)


def add_io_configs(f: Formulation, kid: int, tensors: list[int]) -> tuple[float, Expr]:
    """One-hot IO configurations c_kappa of kernel k (AutoTM 1.5.4), tied to residency by
    marginals: sum_kappa c = 1 and, per tensor i, sum of c over configs with i fast = R(i,k).
    Exact for binary R, and tighter than AutoTM's AND linearization."""
    kernel = f.machine.graph.kernels[kid]
    configs = list(itertools.product((True, False), repeat=len(tensors)))
    cs = [f.var(f"c{kid}_{i}") for i in range(len(configs))]
    f.configs[kid] = (tensors, configs, cs)
    f.row(dict.fromkeys(cs, 1.0), pulp.LpConstraintEQ, 1)
    for i, tid in enumerate(tensors):
        expr: Expr = {c: 1.0 for c, conf in zip(cs, configs, strict=True) if conf[i]}
        for v, coef in f.residency_at(tid, kid).items():
            _add(expr, v, -coef)
        f.row(expr, pulp.LpConstraintEQ, 0)
    expr = {}
    for c, conf in zip(cs, configs, strict=True):
        fast = {t for t, is_fast in zip(tensors, conf, strict=True) if is_fast}
        placement = [FAST if (t in fast or f.paths[t] is None) else SLOW for t in kernel.io]
        expr[c] = f.machine.kernel_time(kid, placement)
    return 0.0, expr


# ---- (5) moves ---------------------------------------------------------------------------
def add_moves(f: Formulation) -> None:
    """Sync reads and writes add their copy time to the objective; async ones add to the
    terms of the kernel they overlap (`MemorySystem.async_terms`)."""
    machine = f.machine
    for tid, p in enumerate(f.paths):
        if p is None:
            continue
        nbytes = int(machine.graph.tensor_bytes[tid])
        for e, v in zip(p.edges, f.x[tid], strict=True):
            if e.kind not in (READ, WRITE, SYNC_READ):
                continue
            if tid in f.fills:  # no copy: a write is a drop, a read a fill kernel
                if e.kind != WRITE:
                    _add(f.objective, v, machine.fill_time(tid) * MS)
                continue
            to = SLOW if e.kind == WRITE else FAST
            mode = SYNC if e.kind == SYNC_READ else \
                (p.gadgets.read if e.kind == READ else p.gadgets.write)[e.layer]
            if mode == SYNC:
                _add(f.objective, v, machine.copying.copy_time(nbytes, to, "sync") * MS)
            elif mode == ASYNC:
                shares = read_shares(f, p, e.layer) if e.kind == READ and f.spread_reads \
                    else write_span(f, tid, p, e.layer) if e.kind == WRITE and \
                    f.spread_writes else ((p.gadgets.kernels[e.layer], 1.0),)
                for name, seconds in machine.copying.async_terms(nbytes, to):
                    for kid, share in shares:
                        if share <= 0:  # a write's span may cross a kernel of no time
                            continue
                        terms = f.async_terms.setdefault(kid, {})
                        _add(terms.setdefault(name, {}), v, seconds * share)


def read_shares(f: Formulation, p: TensorPaths, j: int) -> tuple[tuple[int, float], ...]:
    """Where an async read issued at gadget j is priced: over the kernels from its own to the
    one before the tensor's next use (its copy is joined there), each taking a share of the
    copy in proportion to its time, as a copy stream running beside them would be."""
    g = p.gadgets
    issue = g.kernels[j]
    due = next((g.kernels[i] for i in range(j + 1, len(g.kernels))
                if g.io[i] or g.read[i] == SYNC or g.sync_reads(i)), issue + 1)
    kernels = range(issue, due)  # gadget kernels increase: never empty
    times = [f.machine.fast_time(k) for k in kernels]
    total = sum(times)
    if total <= 0:
        return tuple((k, 1.0 / len(times)) for k in kernels)
    return tuple((k, t / total) for k, t in zip(kernels, times, strict=True) if t > 0)


def write_span(f: Formulation, tid: int, p: TensorPaths, j: int
               ) -> tuple[tuple[int, float], ...]:
    """Where a spread async write issued at gadget j runs: its own kernel and those after it
    until their time covers the copy (the copy stream runs on beside them; the executor frees
    the source when the copy is done), stopping before the tensor's next gadget that may read
    or use it, and at its last kernel; each takes a share of the copy in proportion to its
    time. Cached in `f.write_spans`: the capacity rows, the prices and the decoder read it."""
    key = (tid, j)
    if key in f.write_spans:
        return f.write_spans[key]
    machine, g = f.machine, p.gadgets
    issue = g.kernels[j]
    due = next((g.kernels[i] for i in range(j + 1, len(g.kernels)) if g.io[i] or g.reads(i)),
               last_kernel(f, tid) + 1)
    copy_s = max((s for _, s in machine.copying.async_terms(
        int(machine.graph.tensor_bytes[tid]), SLOW)), default=0.0)
    end = min(due, len(machine.graph.kernels))
    kernels, times = [issue], [machine.fast_time(issue)]
    total = times[0]
    while total < copy_s and kernels[-1] + 1 < end:
        kernels.append(kernels[-1] + 1)
        times.append(machine.fast_time(kernels[-1]))
        total += times[-1]
    span = tuple((k, t / total if total > 0 else 1.0 / len(kernels))
                 for k, t in zip(kernels, times, strict=True))
    f.write_spans[key] = span
    return span


# ---- (6) epigraph ------------------------------------------------------------------------
def add_epigraph(f: Formulation) -> None:
    """For each kernel with async copies: y_k >= T_k and y_k >= sum of each async term
    (AutoTM 1.5.8, with one term per copy engine in GPU mode and the shared-link term)."""
    for kid, terms in f.async_terms.items():
        const, expr = f.kernel_time[kid]
        # y_k >= T_k is a bound when T_k is a constant (GPU), else a row (host placements)
        y = f.var(f"y{kid}", 0.0 if expr else const * MS, None, binary=False)
        f.epigraph[kid] = y
        rows = [(const, expr)] + [(0.0, t) for t in terms.values()]
        for rhs, term in rows:
            if not term:
                continue
            row: Expr = {y: 1.0}
            for v, c in term.items():
                _add(row, v, -c * MS)
            f.row(row, pulp.LpConstraintGE, rhs * MS)
        _add(f.objective, y, 1.0)


# ---- (8) regeneration --------------------------------------------------------------------
def add_regeneration(f: Formulation) -> None:
    """Per (producer p, kernel u) where some output of p may be regenerated: z_{p,u} in {0,1}
    (p re-run before u; the REGEN edge itself when one output may be kept there), with
    x(REGEN of o at u) <= z for each such output o and z <= their sum; D(i, u) >= z for every
    input i of p (held in fast memory for the re-run: kept, read back or regenerated first);
    t_p z in the objective; and the re-run's memory (3b): U_u + ws_p z + sum_o size_o (z -
    x(REGEN of o at u)) <= budget over all outputs o of p (those not kept are made and dropped
    at once)."""
    if f.recompute is None:
        return
    machine = f.machine
    edges = {tid: p.regen_edges() for tid, p in enumerate(f.paths) if p is not None}
    for (pid, u), outputs in f.recompute.groups.items():
        kept = {}
        for t in outputs:
            p = f.paths[t]
            j = p.gadgets.kernels.index(u) if p is not None else -1
            if p is not None and j in edges[t]:
                kept[t] = f.x[t][edges[t][j]]
        if not kept:
            continue
        z = f.var(f"z{pid}_{u}") if len(kept) > 1 else None
        zexpr: Expr = {z: 1.0} if z is not None else {next(iter(kept.values())): 1.0}
        for v in kept.values() if z is not None else ():
            f.row({v: 1.0, z: -1.0}, pulp.LpConstraintLE, 0)
        if z is not None:
            # and z <= sum of them: no re-run that regenerates nothing. Without it a solve
            # stopped within its MIP gap could keep a z at 1 for nothing; the plan (decoded from
            # the regenerations) would then not contain the re-run that the objective charges.
            f.row({z: 1.0, **{v: -1.0 for v in kept.values()}}, pulp.LpConstraintLE, 0)
        f.regen[(pid, u)] = (z, kept)
        _regeneration_inputs(f, pid, u, zexpr)
        _regeneration_memory(f, pid, u, zexpr, kept)
        for v, c in zexpr.items():
            _add(f.objective, v, c * machine.rerun_time(pid) * MS)


def _regeneration_inputs(f: Formulation, pid: int, u: int, z: Expr) -> None:
    """D'(i, u) - z >= 0 for every input i of p's re-run that has decision points, where D'
    is D without an overlapped read at u (that copy runs beside kernel u, after the re-run)."""
    for i in set(f.machine.rerun(pid).inputs):
        p = f.paths[i]
        if p is None:
            continue  # pinned, or fixed in fast memory over its extended range
        j = p.gadgets.kernels.index(u)
        ready = [e for e in p.during[j] if not (p.edges[e].kind == READ and
                                                  p.gadgets.read[j] == ASYNC)]
        expr = dict(f.flows(i, tuple(ready)))
        for v, c in z.items():
            _add(expr, v, -c)
        f.row(expr, pulp.LpConstraintGE, 0)


def _regeneration_memory(f: Formulation, pid: int, u: int, z: Expr,
                         kept: dict[int, Any]) -> None:
    """(3b): U_u + ws_p z + sum over outputs o of p of size_o (z - x_o) <= budget; skipped
    when it cannot bind (the re-run never needs more than kernel u's workspace)."""
    machine = f.machine
    if machine.tensor_budget is None:
        return
    outputs = machine.rerun(pid).outputs
    worst = int(machine.workspace[pid]) + sum(int(machine.sizes[o]) for o in outputs
                                              if len(kept) > 1 or o not in kept)
    if worst <= int(machine.workspace[u]):
        return
    row: Expr = {f.capacity[u]: 1.0}
    for o in outputs:
        size = float(machine.sizes[o]) * MIB
        for v, c in z.items():
            _add(row, v, size * c)
        if o in kept:
            _add(row, kept[o], -size)
    for v, c in z.items():
        _add(row, v, float(machine.workspace[pid]) * MIB * c)
    budget = machine.tensor_budget // ALIGN_BYTES * ALIGN_BYTES
    f.regen_memory.append((u, f.row(row, pulp.LpConstraintLE, budget * MIB)))


# ---- (7) objective -----------------------------------------------------------------------
def set_objective(f: Formulation) -> None:
    """min sum_k (y_k if k has async copies else T_k) + sync copy times + regeneration times,
    in milliseconds (the regeneration terms are added by family 8)."""
    for kid, (const, expr) in f.kernel_time.items():
        if kid in f.async_terms:
            continue
        f.objective_constant += const * MS
        for v, c in expr.items():
            _add(f.objective, v, c * MS)
    terms = [(v, c) for v, c in f.objective.items() if c != 0.0]
    # The constant part (kernel times that no decision changes) goes in as a fixed variable:
    # CBC and HiGHS then measure the relative gap against the whole iteration time, as a user
    # means "within 1%", rather than against the movable part only (PuLP drops constants).
    f.constant_var = f.var("T_fixed", 1, 1, binary=False)
    terms.append((f.constant_var, f.objective_constant))
    f.prob.setObjective(pulp.LpAffineExpression(terms))


def start_kind(f: Formulation, tid: int, values: list[float]) -> int:
    """Decoded start vertex kind (F0 or S) of a tensor from its edge values."""
    p = f.paths[tid]
    assert p is not None
    for kind, edge in p.start.items():
        if values[edge] > 0.5:
            return kind
    return F0
