"""How good are the estimates? Roofline and batch-scaling accuracy against measured profiles.

`roofline_accuracy` compares every entry of a profile set with the roofline estimate of its
own set; `scaling_accuracy` prices a graph from profiles taken at a smaller batch and compares
the batch-scaled kernels with their measured times. `experiments/estimate_accuracy.py` runs
them on profile files and zoo models (the numbers in docs/profiling.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autotm_py.profiling.cache import ProfileSet
from autotm_py.profiling.costmodel import OpShape
from autotm_py.profiling.sources import CostSources, reference_roofline

if TYPE_CHECKING:
    from autotm_py.ir.graph import TensorGraph


def _summary(log_ratios: Sequence[float]) -> dict[str, float]:
    qs = statistics.quantiles(log_ratios, n=10) if len(log_ratios) > 1 else [log_ratios[0]] * 9
    return {"n": len(log_ratios), "median": math.exp(statistics.median(log_ratios)),
            "p10": math.exp(qs[0]), "p90": math.exp(qs[-1])}


def roofline_accuracy(profile_set: ProfileSet) -> dict[str, Any]:
    """Estimate/measured over the set's entries: median, p10, p90 and the ratio of sums."""
    sources = CostSources(profile_set.fingerprint.kind, profile_set.fingerprint, [profile_set])
    roofline = sources.roofline_for(profile_set.fingerprint) or reference_roofline(
        profile_set.fingerprint.kind)
    pairs = [(roofline.time_s(OpShape.of_signature(sig)), entry.median_s)
             for sig, by_pl in profile_set.entries.items() for entry in by_pl.values()
             if entry.median_s > 0]
    result = _summary([math.log(est / meas) for est, meas in pairs])
    result["sum_ratio"] = sum(e for e, _ in pairs) / sum(m for _, m in pairs)
    return result


def scaling_accuracy(graph: TensorGraph, kind: str, measured: Sequence[ProfileSet],
                     small: Sequence[ProfileSet]) -> dict[str, Any]:
    """Scaled (from `small`) over measured (in `measured`) for the kernels that were scaled."""
    model = graph.name.split("/")[0]
    target = (measured or small)[0].fingerprint
    truth = CostSources(kind, target, measured).costs(graph)
    pred = CostSources(kind, target, small).costs(graph)
    ids = [k.id for k in graph.kernels
           if pred.scaled[k.id] and not truth.scaled[k.id] and not truth.estimated[k.id]]
    if not ids:
        return {"model": model, "n": 0}
    result = _summary([math.log(pred.times_s[i] / truth.times_s[i]) for i in ids])
    result["sum_ratio"] = sum(pred.times_s[i] for i in ids) / sum(truth.times_s[i] for i in ids)
    result["model"] = model
    return result
