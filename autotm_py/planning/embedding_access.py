"""The access model of embedding placement (docs/embeddings.md): tables, their rows grouped into
blocks, lookups per batch (generated from a seeded power law, or read from a trace file) and the
per-block access counts measured from those lookups.

Blocks are made of rows numbered by popularity, hottest first: the rows of a trace (a file, or the
Zipf generator's, whose hot rows are scattered over the ids) are renumbered by their counts in
the batches planned from (`renumber_by_count`), and the executor applies the same row map. Only
shapes and counts are kept here: a table of tens of GB is never allocated, so the big
configurations plan and simulate on any machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from autotm_py.errors import ConfigError


@dataclass(frozen=True)
class EmbeddingTable:
    name: str
    rows: int
    dim: int
    dtype_bytes: int = 4

    @property
    def row_bytes(self) -> int:
        return self.dim * self.dtype_bytes

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes


@dataclass(frozen=True)
class EmbeddingWorkload:
    """The tables of a model's embedding stage and how they are looked up: `batch` samples per
    batch, `pooling` indices per sample and table (one bag each), rows grouped into blocks of
    `block_rows`. `dense_bytes`: fast memory the rest of the model (MLPs, activations) takes."""

    name: str
    tables: tuple[EmbeddingTable, ...]
    batch: int
    pooling: int = 1
    block_rows: int = 4096
    dense_bytes: int = 0

    def __post_init__(self) -> None:
        if self.block_rows < 1 or self.batch < 1 or self.pooling < 1:
            raise ConfigError("block rows, batch and pooling must be positive")

    @property
    def table_bytes(self) -> int:
        return sum(t.nbytes for t in self.tables)

    def blocks_of(self, table: int) -> int:
        return -(-self.tables[table].rows // self.block_rows)

    @cached_property
    def block_sizes(self) -> tuple[np.ndarray, ...]:
        """Rows in each block of each table (the last block of a table may be short)."""
        out = []
        for i, t in enumerate(self.tables):
            sizes = np.full(self.blocks_of(i), self.block_rows, dtype=np.int64)
            sizes[-1] = t.rows - self.block_rows * (len(sizes) - 1)
            out.append(sizes)
        return tuple(out)

    @property
    def lookups_per_batch(self) -> int:
        return self.batch * self.pooling


# A trace: per batch, per table, the int64 row indices looked up (batch * pooling of them).
Trace = list[list[np.ndarray]]


def zipf_probabilities(rows: int, alpha: float) -> np.ndarray:
    """P(row r) proportional to (r + 1) ** -alpha, r = 0 .. rows - 1 (row 0 the hottest)."""
    weights = np.arange(1, rows + 1, dtype=np.float64) ** -alpha
    return weights / weights.sum()


def zipf_trace(workload: EmbeddingWorkload, *, alpha: float, seed: int, batches: int,
               scatter: bool = True) -> Trace:
    """`batches` batches of lookups, each table's rows drawn from a Zipf law of exponent
    `alpha` (0: uniform) with one seeded generator per table. `scatter`: the popularity ranks
    land on rows in a seeded random order (as hashed ids do), so that a planner knows the hot
    rows only from counting them; else row r is the r-th most popular."""
    if alpha < 0:
        raise ConfigError(f"--zipf {alpha}: the exponent must be >= 0")
    n = workload.lookups_per_batch
    columns = []
    for i, table in enumerate(workload.tables):
        rng = np.random.default_rng([seed, i])
        cdf = np.cumsum(np.arange(1, table.rows + 1, dtype=np.float64) ** -alpha)
        draws = rng.random(batches * n) * cdf[-1]
        rows = np.minimum(np.searchsorted(cdf, draws, side="right"), table.rows - 1)
        if scatter:
            rows = rng.permutation(table.rows)[rows]
        columns.append(rows.astype(np.int64).reshape(batches, n))
        del cdf
    return [[col[b] for col in columns] for b in range(batches)]


def load_trace(path: str | os.PathLike[str], workload: EmbeddingWorkload) -> Trace:
    """A trace file: an ``.npz`` with one int array per table (named as the table, or
    ``table<i>``), either (batches, lookups) or flat (cut into batches of batch * pooling)."""
    n = workload.lookups_per_batch
    with np.load(path) as data:
        columns = []
        for i, table in enumerate(workload.tables):
            key = table.name if table.name in data else f"table{i}"
            if key not in data:
                raise ConfigError(f"--trace {path}: no array {table.name!r} or 'table{i}'")
            flat = np.asarray(data[key], dtype=np.int64).reshape(-1)
            if flat.size < n or flat.min() < 0 or flat.max() >= table.rows:
                raise ConfigError(f"--trace {path}: {key} needs >= {n} indices in "
                                  f"[0, {table.rows})")
            columns.append(flat[: flat.size // n * n].reshape(-1, n))
    batches = min(len(c) for c in columns)
    return [[col[b] for col in columns] for b in range(batches)]


def renumber_by_count(trace: Trace, workload: EmbeddingWorkload,
                      profile_batches: int) -> tuple[Trace, list[np.ndarray]]:
    """The trace with each table's rows renumbered hottest first, by their count over the first
    `profile_batches` batches (ties by row id), and the maps old row -> new row."""
    maps = []
    for i, table in enumerate(workload.tables):
        seen = [batch[i] for batch in trace[:profile_batches]]
        counts = np.bincount(np.concatenate(seen), minlength=table.rows)
        order = np.argsort(-counts, kind="stable")
        new = np.empty(table.rows, dtype=np.int64)
        new[order] = np.arange(table.rows)
        maps.append(new)
    return [[maps[i][rows] for i, rows in enumerate(batch)] for batch in trace], maps


@dataclass(frozen=True)
class BlockCounts:
    """Measured per-block counts, per table: mean accesses per batch, mean distinct rows touched
    per batch, and the most distinct rows touched in one batch (what a copy-ahead stages)."""

    accesses: tuple[np.ndarray, ...]
    distinct: tuple[np.ndarray, ...]
    distinct_peak: tuple[np.ndarray, ...]
    batches: int

    @property
    def total_accesses(self) -> float:
        return float(sum(a.sum() for a in self.accesses))


def count_blocks(workload: EmbeddingWorkload, trace: Trace) -> BlockCounts:
    """Count, batch by batch, how often each block is read and how many of its rows."""
    if not trace:
        raise ConfigError("no batches to count accesses from")
    acc, dist, peak = [], [], []
    for i in range(len(workload.tables)):
        nb = workload.blocks_of(i)
        a = np.zeros(nb, dtype=np.float64)
        d = np.zeros(nb, dtype=np.float64)
        p = np.zeros(nb, dtype=np.int64)
        for batch in trace:
            rows = batch[i]
            a += np.bincount(rows // workload.block_rows, minlength=nb)
            touched = np.bincount(np.unique(rows) // workload.block_rows, minlength=nb)
            d += touched
            np.maximum(p, touched, out=p)
        acc.append(a / len(trace))
        dist.append(d / len(trace))
        peak.append(p)
    return BlockCounts(tuple(acc), tuple(dist), tuple(peak), len(trace))


def expected_block_shares(workload: EmbeddingWorkload, table: int, alpha: float) -> np.ndarray:
    """The Zipf law's share of a table's lookups that falls in each block (for checking the
    generator against the formula; planning uses measured counts only)."""
    p = zipf_probabilities(workload.tables[table].rows, alpha)
    starts = np.arange(0, len(p), workload.block_rows)
    return np.add.reduceat(p, starts)


def hot_share(counts: BlockCounts, workload: EmbeddingWorkload, fraction: float,
              order: BlockCounts | None = None) -> float:
    """Share of the lookups in `counts` that the hottest `fraction` of the tables' bytes serve,
    blocks ranked by accesses per byte in `order` (default: `counts` itself): the skew, stated
    in one number."""
    ranked = order or counts
    dens, size, acc = [], [], []
    for i, t in enumerate(workload.tables):
        nbytes = workload.block_sizes[i] * t.row_bytes
        dens.append(ranked.accesses[i] / nbytes)
        size.append(nbytes)
        acc.append(counts.accesses[i])
    order_ix = np.argsort(-np.concatenate(dens), kind="stable")
    size_sorted = np.concatenate(size)[order_ix]
    acc_sorted = np.concatenate(acc)[order_ix]
    within = np.cumsum(size_sorted) <= fraction * workload.table_bytes
    total = acc_sorted.sum()
    return float(acc_sorted[within].sum() / total) if total else 0.0


def workload_from_json(path: str | os.PathLike[str], **fields: int) -> EmbeddingWorkload:
    """A workload file: ``{"name", "tables": [{"name", "rows", "dim"}], "batch", "pooling",
    "dense_bytes"}`` (block rows, batch and pooling may be given as `fields` instead)."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
        tables = tuple(EmbeddingTable(str(t.get("name", f"table{i}")), int(t["rows"]),
                                      int(t["dim"]), int(t.get("dtype_bytes", 4)))
                       for i, t in enumerate(spec["tables"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"embedding workload {path}: {exc}") from None
    given = {k: int(spec[k]) for k in ("batch", "pooling", "block_rows", "dense_bytes")
             if k in spec}
    given.update({k: v for k, v in fields.items() if v is not None})
    return EmbeddingWorkload(str(spec.get("name", os.path.basename(str(path)))), tables,
                             **given)
