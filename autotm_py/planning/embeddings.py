"""Embedding placement at row blocks (docs/embeddings.md): one small ILP decides, for every
block of every table, whether it lives in HBM, stays in pinned host memory and is read by the
lookup kernel over the link (zero-copy), or stays in host memory and has the rows its batch
needs copied ahead into an HBM staging buffer. The costs come from the memory system's link;
the counts are measured (`embedding_access.count_blocks`). `predict` prices any placement on
any counts (the simulator), `greedy` is the hot-first baseline, `solve_placement` the ILP.

One batch, in the model (equations E1-E4 of docs/embeddings.md):
  lookup L = sum over blocks of accesses x (HBM cost if resident or staged, else zero-copy cost)
             + launches + one pooling pass's latency (two if any block is copied ahead)
  copy   C = copy latency (if any block is copied ahead) + staged rows x row bytes / copy bw
  batch  T = max(L + dense, C)   (the copy of batch k+1 overlaps batch k)
  memory: resident bytes + staging bytes (each copied block's most rows in one batch) <= budget
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from autotm_py.memory.tiers import MemorySystem
from autotm_py.planning.embedding_access import BlockCounts, EmbeddingWorkload

HOST, HBM, COPY = 0, 1, 2  # where a block is served from: zero-copy host, resident, copy-ahead
# The fixed costs' defaults, from H200 measurements of 2026-12-02 (torch 2.11; batch 2048 of
# the 26 Kaggle tables x2, dim 128: 53,248 bags of one row): one embedding_bag over 53,248
# random HBM rows took 0.085 ms, 26 steps of its kernel (53,248 x 4 chunks / 8192 warps) for
# 0.006 ms of row traffic, so chain_s = 0.079 ms / 26; the all-HBM lookup (0.493 ms a batch
# with the MLPs, 0.342 ms without, at 14:03 UTC) took 0.151 ms, the other 0.066 ms its
# launches. One point each, on one device: stated, not fitted.
KERNEL_WARPS = 1024 * 8  # torch's CUDA embedding_bag: a grid of 1024 blocks of 32 x 8 threads
CHAIN_S = 0.079e-3 / 26
LAUNCH_S = 0.066e-3
WHERE = ("host", "hbm", "copy")


@dataclass(frozen=True)
class LookupCosts:
    """What one row access costs where it is served from (seconds; bandwidths in bytes/s)."""

    hbm_bw: float
    link_bw: float  # zero-copy reads of host rows by the lookup kernel
    copy_bw: float  # copies ahead of a batch, overlapped with the previous batch
    copy_latency_s: float
    access_latency_s: float = 1e-9  # one zero-copy read's latency over the reads in flight
    granule: int = 64  # a zero-copy read moves whole granules (PCIe requests, L2 sectors)
    dense_s: float = 0.0  # the rest of a batch on the compute stream (MLPs)
    # fixed costs the row traffic leaves out (docs/embeddings.md, "The costs"): a lookup's
    # kernel launches, once per batch; and each pooling pass's latency, per sequential step
    # of torch's embedding_bag kernel (a fixed grid of 8192 warps, each taking bag x 32-float
    # chunks one after another, a chain of dependent loads each), added to the traffic. The
    # HBM + zero-copy rows are one pass; staged (copied-ahead) rows a second
    launch_s: float = 0.0
    chain_s: float = 0.0

    @classmethod
    def from_memory(cls, memory: MemorySystem, **overrides: float) -> LookupCosts:
        link = memory.link
        costs = cls(hbm_bw=memory.fast.read_bw, link_bw=link.read_bw,
                    copy_bw=link.async_read_bw, copy_latency_s=link.latency_s,
                    launch_s=LAUNCH_S, chain_s=CHAIN_S)
        return replace(costs, **overrides)

    def hbm_access(self, row_bytes: int) -> float:
        return row_bytes / self.hbm_bw

    def host_access(self, row_bytes: int) -> float:
        moved = math.ceil(row_bytes / self.granule) * self.granule
        return self.access_latency_s + moved / self.link_bw

    def copy_rows(self, rows: float, row_bytes: int) -> float:
        return rows * row_bytes / self.copy_bw

    def pass_floor(self, workload: EmbeddingWorkload) -> float:
        """One pooling pass's latency: its kernel's sequential steps x chain_s."""
        chunks = workload.batch * sum(-(-t.dim // 32) for t in workload.tables)
        return -(-chunks // KERNEL_WARPS) * workload.pooling * self.chain_s


@dataclass(frozen=True)
class Placement:
    """Per table, one code per block: HOST (0), HBM (1) or COPY (2)."""

    where: tuple[np.ndarray, ...]

    @classmethod
    def uniform(cls, workload: EmbeddingWorkload, code: int) -> Placement:
        return cls(tuple(np.full(workload.blocks_of(i), code, dtype=np.int8)
                         for i in range(len(workload.tables))))

    def resident_bytes(self, workload: EmbeddingWorkload) -> int:
        return int(sum((workload.block_sizes[i][w == HBM].sum()) * t.row_bytes
                       for i, (t, w) in enumerate(zip(workload.tables, self.where, strict=True))))

    def staging_bytes(self, workload: EmbeddingWorkload, counts: BlockCounts) -> int:
        return int(sum(counts.distinct_peak[i][w == COPY].sum() * t.row_bytes
                       for i, (t, w) in enumerate(zip(workload.tables, self.where, strict=True))))

    def blocks(self) -> dict[str, int]:
        return {name: int(sum((w == code).sum() for w in self.where))
                for code, name in enumerate(WHERE)}


@dataclass(frozen=True)
class LookupTime:
    """A placement priced on counts: seconds per batch, and what it holds in HBM."""

    lookup_s: float
    copy_s: float
    batch_s: float
    hbm_bytes: int  # resident blocks + the copy-ahead staging (or the cache)
    hbm_share: float  # share of the accesses served from HBM

    def as_dict(self) -> dict[str, float]:
        return {"lookup_ms": self.lookup_s * 1e3, "copy_ms": self.copy_s * 1e3,
                "batch_ms": self.batch_s * 1e3, "hbm_bytes": self.hbm_bytes,
                "hbm_share": self.hbm_share}


def predict(workload: EmbeddingWorkload, placement: Placement, counts: BlockCounts,
            costs: LookupCosts) -> LookupTime:
    """The simulator: equations E1-E3 for `placement` on `counts`."""
    lookup = copy = served = 0.0
    for i, t in enumerate(workload.tables):
        w, acc = placement.where[i], counts.accesses[i]
        fast = w != HOST
        lookup += acc[fast].sum() * costs.hbm_access(t.row_bytes)
        lookup += acc[~fast].sum() * costs.host_access(t.row_bytes)
        copy += costs.copy_rows(counts.distinct[i][w == COPY].sum(), t.row_bytes)
        served += acc[fast].sum()
    lookup += costs.launch_s + costs.pass_floor(workload)
    if any((w == COPY).any() for w in placement.where):
        copy += costs.copy_latency_s
        lookup += costs.pass_floor(workload)  # the staged rows' own pooling pass
    total = counts.total_accesses
    return LookupTime(lookup, copy, max(lookup + costs.dense_s, copy),
                      placement.resident_bytes(workload)
                      + placement.staging_bytes(workload, counts),
                      served / total if total else 1.0)


def table_budget(workload: EmbeddingWorkload, budget_bytes: int) -> int:
    """HBM left for the tables once the dense part of the model has its memory."""
    return budget_bytes - workload.dense_bytes


def greedy(workload: EmbeddingWorkload, counts: BlockCounts, costs: LookupCosts,
           budget_bytes: int, *, fill: bool = True) -> Placement:
    """Hot first: blocks by time saved per byte, each made resident while it fits, then the
    blocks never read in the profile (as the ILP's placement); the rest zero-copy (the
    UVM-style static split; no copy-ahead)."""
    left = table_budget(workload, budget_bytes)
    items = []
    for i, t in enumerate(workload.tables):
        nbytes = workload.block_sizes[i] * t.row_bytes
        gain = counts.accesses[i] * (costs.host_access(t.row_bytes)
                                     - costs.hbm_access(t.row_bytes))
        items += [(-g / b, i, j, int(b)) for j, (g, b) in enumerate(zip(gain, nbytes,
                                                                          strict=True)) if g > 0]
    where = [np.zeros(workload.blocks_of(i), dtype=np.int8) for i in range(len(workload.tables))]
    for _, i, j, nbytes in sorted(items):
        if nbytes <= left:
            where[i][j] = HBM
            left -= nbytes
    placed = Placement(tuple(where))
    return _fill_unread(workload, placed, counts, table_budget(workload, budget_bytes)) \
        if fill else placed


def with_copies(workload: EmbeddingWorkload, counts: BlockCounts, costs: LookupCosts,
                room: int, start: Placement) -> Placement:
    """`start`, then host blocks copied ahead, by lookup time saved per staged byte, while the
    staging fits in `room` and the copies stay shorter than the batch's compute (the ILP's
    first solution when it may copy ahead)."""
    left = room - start.resident_bytes(workload)
    lookup = predict(workload, start, counts, costs).lookup_s + costs.dense_s
    copy = costs.copy_latency_s
    items = []
    for i, t in enumerate(workload.tables):
        saving = costs.host_access(t.row_bytes) - costs.hbm_access(t.row_bytes)
        for j in np.flatnonzero((counts.accesses[i] > 0) & (start.where[i] == HOST)):
            staged = int(counts.distinct_peak[i][j]) * t.row_bytes
            gain = float(counts.accesses[i][j]) * saving
            items.append((-gain / max(staged, 1), i, int(j), gain, staged,
                          costs.copy_rows(float(counts.distinct[i][j]), t.row_bytes)))
    where = [w.copy() for w in start.where]
    for _, i, j, gain, staged, cost in sorted(items):
        if staged <= left and copy + cost <= lookup - gain:
            where[i][j] = COPY
            left, lookup, copy = left - staged, lookup - gain, copy + cost
    return Placement(tuple(where))


@dataclass(frozen=True)
class PlacementResult:
    """The ILP's answer: a placement (None if infeasible), its objective and how it ended."""

    placement: Placement | None
    status: str
    objective_s: float | None
    seconds: float
    variables: int
    greedy_s: float | None = None  # the greedy placement priced on the same counts

    @property
    def feasible(self) -> bool:
        return self.placement is not None


def _block_terms(workload: EmbeddingWorkload, counts: BlockCounts, costs: LookupCosts,
                 ) -> list[tuple[int, int, float, float, int, int]]:
    """(table, block, access time saved in HBM, copy time if copied ahead, resident bytes,
    staging bytes) of every block that is read at all (the others stay in host memory)."""
    out = []
    for i, t in enumerate(workload.tables):
        saving = costs.host_access(t.row_bytes) - costs.hbm_access(t.row_bytes)
        for j in np.flatnonzero(counts.accesses[i] > 0):
            out.append((i, int(j), float(counts.accesses[i][j]) * saving,
                        costs.copy_rows(float(counts.distinct[i][j]), t.row_bytes),
                        int(workload.block_sizes[i][j]) * t.row_bytes,
                        int(counts.distinct_peak[i][j]) * t.row_bytes))
    return out


US = 1e6  # the ILP is written in microseconds (HiGHS loses sub-1e-3 differences)
TIE_BREAK = 1e-4  # L and C themselves, weighted this much, decide between equal batch times


def solve_placement(workload: EmbeddingWorkload, counts: BlockCounts, costs: LookupCosts,
                    budget_bytes: int, *, copy_ahead: bool = True, solver: str = "highs",
                    time_limit: float | None = 30.0, gap: float = 1e-3) -> PlacementResult:
    """The block-placement ILP (E1-E4) on measured `counts` within `budget_bytes` of HBM.
    Solved twice: without copy-ahead (a knapsack), and with it, its latency paid once; the
    better placement wins (exact: a plan copies ahead or it does not)."""
    started = time.perf_counter()
    room = table_budget(workload, budget_bytes)
    if room < 0:
        return PlacementResult(None, "infeasible", None, time.perf_counter() - started, 0)
    start = greedy(workload, counts, costs, budget_bytes, fill=False)
    greedy_s = predict(workload, start, counts, costs).batch_s  # fill: the same time here
    terms = _block_terms(workload, counts, costs)
    best: tuple[float, Placement, str] | None = None
    variables = 0
    for with_copy in (False, True) if copy_ahead else (False,):
        limit = None if time_limit is None else \
            time_limit / 2 if copy_ahead and not with_copy else \
            max(time_limit - (time.perf_counter() - started), 1.0)
        first = with_copies(workload, counts, costs, room, start) if with_copy else start
        found = _solve_one(workload, counts, costs, room, terms, first, with_copy,
                           solver=solver, time_limit=limit, gap=gap)
        variables += found[2]
        if found[0] is not None:
            time_s = predict(workload, found[0], counts, costs).batch_s
            if best is None or time_s < best[0]:
                best = (time_s, found[0], found[1])
    seconds = time.perf_counter() - started
    if best is None:
        return PlacementResult(None, "no_solution", None, seconds, variables, greedy_s)
    placement = _fill_unread(workload, best[1], counts, room)
    return PlacementResult(placement, best[2], best[0], seconds, variables, greedy_s)


def _fill_unread(workload: EmbeddingWorkload, placement: Placement, counts: BlockCounts,
                 room: int) -> Placement:
    """Blocks the profile never read made resident while the budget has room, lowest block
    first (rows are numbered hottest first): free in the model, a hit if they are read later."""
    left = room - placement.resident_bytes(workload) - placement.staging_bytes(workload, counts)
    where = [w.copy() for w in placement.where]
    by_rank = sorted((j, i) for i in range(len(where))
                     for j in np.flatnonzero((counts.accesses[i] == 0) & (where[i] == HOST)))
    for j, i in by_rank:
        nbytes = int(workload.block_sizes[i][j]) * workload.tables[i].row_bytes
        if nbytes <= left:
            where[i][j] = HBM
            left -= nbytes
    return Placement(tuple(where))


def _solve_one(workload: EmbeddingWorkload, counts: BlockCounts, costs: LookupCosts,
               room: int, terms: list, start: Placement, with_copy: bool, **solve: Any,
               ) -> tuple[Placement | None, str, int]:
    """One ILP: blocks resident or zero-copy, and with `with_copy` also copied ahead (the copy
    latency then a constant); started from `start`."""
    import pulp

    from autotm_py.planning.solvers import run_solver

    prob = pulp.LpProblem("embedding_blocks", pulp.LpMinimize)
    x_hbm = [pulp.LpVariable(f"h{k}", cat="Binary") for k in range(len(terms))]
    x_copy = [pulp.LpVariable(f"c{k}", cat="Binary") for k in range(len(terms))] \
        if with_copy else []
    base = sum(acc * costs.host_access(t.row_bytes) for t, acc in
               zip(workload.tables, (a.sum() for a in counts.accesses), strict=True))
    base += costs.launch_s + costs.pass_floor(workload) * (2 if with_copy else 1)  # constants
    in_fast = [x_hbm[k] + (x_copy[k] if with_copy else 0) for k in range(len(terms))]
    # E1: lookup time (every access zero-copy, less what each block in HBM saves, plus the
    # launches and the pooling passes) and copy time
    lookup = base * US - pulp.lpSum(term[2] * US * f for term, f in zip(terms, in_fast,
                                                                        strict=True))
    copy = (costs.copy_latency_s * US + pulp.lpSum(t[3] * US * c for t, c in
                                                   zip(terms, x_copy, strict=True))) \
        if with_copy else 0
    batch = pulp.LpVariable("batch_us", lowBound=0)
    prob += batch + TIE_BREAK * (lookup + copy)  # E4: the batch time, then L and C
    prob += batch >= lookup + costs.dense_s * US, "E3_compute"
    prob += batch >= copy, "E3_copy"
    _one_place(prob, x_hbm, x_copy)
    staged = pulp.lpSum(t[5] * c for t, c in zip(terms, x_copy, strict=False))
    prob += pulp.lpSum(t[4] * h for t, h in zip(terms, x_hbm, strict=True)) + staged <= room, \
        "E2_budget"
    _start_from(start, terms, x_hbm, x_copy, batch, (lookup + costs.dense_s * US, copy))
    outcome = run_solver(prob, solve.pop("solver"), warm_start=True, **solve)
    if not outcome.has_solution:
        return None, outcome.status, len(x_hbm) + len(x_copy)
    return _decode(workload, terms, x_hbm, x_copy), outcome.status, len(x_hbm) + len(x_copy)


def _one_place(prob: object, x_hbm: list, x_copy: list) -> None:
    """E2 (one place): a block is resident, copied ahead, or neither (zero-copy)."""
    for k, (h, c) in enumerate(zip(x_hbm, x_copy, strict=False)):
        prob += h + c <= 1, f"E2_one_{k}"  # type: ignore[operator]


def _start_from(start: Placement, terms: list, x_hbm: list, x_copy: list, batch: Any,
                bounds: tuple[Any, ...]) -> None:
    """`start` (greedy, or greedy with copies) as the solver's first solution: the ILP is
    never worse. `bounds`: the expressions the batch time must cover (E3)."""
    import pulp

    for k, (i, j, *_rest) in enumerate(terms):
        x_hbm[k].setInitialValue(int(start.where[i][j] == HBM))
        if x_copy:
            x_copy[k].setInitialValue(int(start.where[i][j] == COPY))
    batch.setInitialValue(max(float(pulp.value(b) or 0.0) for b in bounds))


def _decode(workload: EmbeddingWorkload, terms: list, x_hbm: list, x_copy: list) -> Placement:
    where = [np.zeros(workload.blocks_of(i), dtype=np.int8) for i in range(len(workload.tables))]
    for k, (i, j, *_rest) in enumerate(terms):
        if (x_hbm[k].value() or 0) > 0.5:
            where[i][j] = HBM
        elif x_copy and (x_copy[k].value() or 0) > 0.5:
            where[i][j] = COPY
    return Placement(tuple(where))


def all_hbm(workload: EmbeddingWorkload, budget_bytes: int) -> Placement | None:
    """Every block resident, if the tables fit."""
    if workload.table_bytes > table_budget(workload, budget_bytes):
        return None
    return Placement.uniform(workload, HBM)
