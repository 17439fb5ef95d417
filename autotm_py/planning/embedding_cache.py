"""The online baseline of embedding placement: an LRU row cache in HBM (as TorchRec/FBGEMM's
UVM caching keeps one), fed the same trace. Before each batch, the rows it needs and the cache
lacks are read from host memory (zero-copy, on the critical path) and inserted; the least
recently used rows leave when the cache is full. It is warmed on the batches the ILP was planned
from, then priced on the batches that follow, as the planner's placements are.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from autotm_py.planning.embedding_access import EmbeddingWorkload, Trace
from autotm_py.planning.embeddings import LookupCosts, LookupTime

ROW_BITS = 40  # a cache key: table << ROW_BITS | row


class LruRowCache:
    """An LRU set of (table, row) keys holding at most `capacity_bytes` of rows."""

    def __init__(self, workload: EmbeddingWorkload, capacity_bytes: int) -> None:
        self.workload = workload
        self.capacity = max(int(capacity_bytes), 0)
        self.used = 0
        self.rows: OrderedDict[int, int] = OrderedDict()  # key -> row bytes

    def batch(self, batch: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Serve one batch: per table, the rows it missed and the accesses to rows it had
        (unique rows and their access counts; the rest of the batch's accesses hit)."""
        missed, hits = [], []
        for i, rows in enumerate(batch):
            row_bytes = self.workload.tables[i].row_bytes
            unique, count = np.unique(rows, return_counts=True)
            miss = np.zeros(len(unique), dtype=bool)
            for k, row in enumerate(unique.tolist()):
                key = i << ROW_BITS | row
                if key in self.rows:
                    self.rows.move_to_end(key)
                    continue
                miss[k] = True
                self._insert(key, row_bytes)
            missed.append(unique[miss])
            hits.append(count[~miss])
        return missed, hits

    def _insert(self, key: int, row_bytes: int) -> None:
        if row_bytes > self.capacity:
            return
        self.rows[key] = row_bytes
        self.used += row_bytes
        while self.used > self.capacity:
            _, freed = self.rows.popitem(last=False)
            self.used -= freed


def lru_time(workload: EmbeddingWorkload, warm: Trace, trace: Trace, capacity_bytes: int,
             costs: LookupCosts) -> LookupTime:
    """An LRU row cache of `capacity_bytes`, warmed on `warm` and priced per batch (mean) on
    `trace`: a missed row is read once over the link and written to the cache; every other
    access reads HBM."""
    cache = LruRowCache(workload, capacity_bytes)
    if cache.capacity < min(t.row_bytes for t in workload.tables):  # holds no row
        cache = LruRowCache(workload, 0)
    for batch in warm:
        cache.batch(batch)
    lookup = served = total = 0.0
    for batch in trace:
        missed, _ = cache.batch(batch)
        for i, rows in enumerate(batch):
            row_bytes = workload.tables[i].row_bytes
            misses = len(missed[i]) if cache.capacity else len(rows)
            insert = costs.hbm_access(row_bytes) if cache.capacity else 0.0  # no cache: none
            lookup += misses * (costs.host_access(row_bytes) + insert)
            lookup += (len(rows) - misses) * costs.hbm_access(row_bytes)
            served += len(rows) - misses
            total += len(rows)
    # one pooling pass, as a placement's (its fills' two small kernels not counted)
    lookup = lookup / max(len(trace), 1) + costs.launch_s + costs.pass_floor(workload)
    return LookupTime(lookup, 0.0, lookup + costs.dense_s, cache.capacity,
                      served / total if total else 1.0)
