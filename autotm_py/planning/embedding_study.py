"""An embedding-placement study: lookups (Zipf or a trace), counts measured on the first
batches, the ILP and the baselines planned for each budget, all priced by the simulator on the
batches that follow (docs/embeddings.md). `autotm embeddings` prints it; the GPU benchmark
(experiments/gpu/dlrm_embeddings.py) plans with it and measures the same placements.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autotm_py.errors import ConfigError
from autotm_py.planning.embedding_access import (
    BlockCounts,
    EmbeddingWorkload,
    Trace,
    count_blocks,
    hot_share,
    load_trace,
    renumber_by_count,
    zipf_trace,
)
from autotm_py.planning.embedding_cache import lru_time
from autotm_py.planning.embeddings import (
    HOST,
    LookupCosts,
    Placement,
    PlacementResult,
    all_hbm,
    greedy,
    predict,
    solve_placement,
)


@dataclass(frozen=True)
class Lookups:
    """The trace split into the batches planned from (`profile`) and those priced (`held`)."""

    profile: Trace
    held: Trace
    skew: str  # how the lookups were made, in words
    counts: BlockCounts  # measured on `profile`
    held_counts: BlockCounts  # measured on `held`
    row_maps: list[Any] = field(default_factory=list)  # trace rows -> renumbered rows


def make_lookups(workload: EmbeddingWorkload, *, alpha: float | None = 1.05, seed: int = 0,
                 trace_path: str | None = None, profile_batches: int = 32,
                 held_batches: int = 8, scatter: bool = True) -> Lookups:
    """Zipf(`alpha`, `seed`) lookups, or the trace file's, rows renumbered hottest first by
    their counts in the profile batches; counts measured on each part."""
    if profile_batches < 1 or held_batches < 1:
        raise ConfigError("profile and held-out batches must be at least 1 each")
    wanted = profile_batches + held_batches
    maps: list[Any] = []
    if trace_path is not None:
        trace = load_trace(trace_path, workload)
        if len(trace) < wanted:
            raise ConfigError(f"--trace {trace_path}: {len(trace)} batches, {wanted} needed")
        skew = f"trace {trace_path}"
    else:
        trace = zipf_trace(workload, alpha=alpha or 0.0, seed=seed, batches=wanted,
                           scatter=scatter)
        skew = f"zipf {alpha} seed {seed}, {'scattered' if scatter else 'ranked'} rows"
    if trace_path is not None or scatter:  # else the ids are the ranks already
        trace, maps = renumber_by_count(trace[:wanted], workload, profile_batches)
    profile, held = trace[:profile_batches], trace[profile_batches:]
    return Lookups(profile, held, skew, count_blocks(workload, profile),
                   count_blocks(workload, held), maps)


def _row(name: str, time: Any, **extra: Any) -> dict[str, Any]:
    if time is None:
        return {"name": name, "fits": False, **extra}
    return {"name": name, "fits": True, **time.as_dict(), **extra}


def study_budget(workload: EmbeddingWorkload, lookups: Lookups, costs: LookupCosts,
                 budget: int, *, copy_ahead: bool = True, time_limit: float | None = 30.0,
                 with_lru: bool = True) -> tuple[dict[str, Any], PlacementResult]:
    """One budget: the ILP, hot-first greedy, the LRU cache, all-host and all-HBM, planned on
    the profile counts and priced on the held-out ones."""
    held = lookups.held_counts
    result = solve_placement(workload, lookups.counts, costs, budget, copy_ahead=copy_ahead,
                             time_limit=time_limit)
    rows = []
    if result.placement is not None:
        rows.append(_row("ilp", predict(workload, result.placement, held, costs),
                         status=result.status, blocks=result.placement.blocks(),
                         planned_ms=result.objective_s * 1e3 if result.objective_s else None,
                         solve_s=result.seconds))
        rows.append(_row("greedy", predict(workload, greedy(workload, lookups.counts, costs,
                                                            budget), held, costs),
                         planned_ms=(result.greedy_s or 0.0) * 1e3))
    else:
        rows.append(_row("ilp", None, status=result.status))
    if with_lru:
        room = max(budget - workload.dense_bytes, 0)
        rows.append(_row("lru", lru_time(workload, lookups.profile, lookups.held, room, costs)))
    rows.append(_row("all-host", predict(workload, Placement.uniform(workload, HOST), held,
                                         costs)))
    full = all_hbm(workload, budget)
    rows.append(_row("all-hbm", None if full is None else predict(workload, full, held, costs)))
    return {"budget_bytes": budget, "share": budget / max(workload.table_bytes, 1),
            "rows": rows}, result


def study(workload: EmbeddingWorkload, lookups: Lookups, costs: LookupCosts,
          budgets: Sequence[int], **options: Any) -> dict[str, Any]:
    """Every budget of `budgets`; a JSON-shaped result with the workload and the skew."""
    out = [study_budget(workload, lookups, costs, b, **options)[0] for b in budgets]
    return {"workload": describe(workload), "skew": lookups.skew,
            "profile_batches": len(lookups.profile), "held_batches": len(lookups.held),
            "hot_10pct_share": hot_share(lookups.held_counts, workload, 0.10, lookups.counts),
            "costs": {k: getattr(costs, k) for k in costs.__dataclass_fields__},
            "budgets": out}


def describe(workload: EmbeddingWorkload) -> dict[str, Any]:
    return {"name": workload.name, "tables": len(workload.tables),
            "rows": sum(t.rows for t in workload.tables),
            "table_bytes": workload.table_bytes, "dense_bytes": workload.dense_bytes,
            "batch": workload.batch, "pooling": workload.pooling,
            "block_rows": workload.block_rows,
            "blocks": sum(workload.blocks_of(i) for i in range(len(workload.tables)))}
