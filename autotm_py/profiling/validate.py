"""How good are the estimates? Roofline and batch-scaling accuracy against measured profiles.

    python -m autotm_py.profiling.validate roofline profiles/h100-80gb-hbm3.json
    python -m autotm_py.profiling.validate scaling cuda MEASURED_DIR SMALL_DIR resnet50 ...

`roofline` compares every entry of a profile file with the roofline estimate of its own set.
`scaling` plans each zoo model (training, default batch) from the profiles in SMALL_DIR (taken
at a smaller batch) and compares the batch-scaled kernels with their times in MEASURED_DIR.
The numbers in docs/profiling.md were made this way.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotm_py.profiling.cache import ProfileSet, load_sets, read_profile_file
from autotm_py.profiling.costmodel import OpShape
from autotm_py.profiling.sources import CostSources, reference_roofline


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


def scaling_accuracy(model: str, kind: str, measured: Sequence[ProfileSet],
                     small: Sequence[ProfileSet], batch: int | None = None) -> dict[str, Any]:
    """Scaled (from `small`) over measured (in `measured`) for the kernels that were scaled."""
    from autotm_py.api import load_model

    graph = load_model(model, batch=batch, training=True)
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


def main(argv: Sequence[str]) -> int:
    if argv[:1] == ["roofline"] and len(argv) == 2:
        for fp_id, s in read_profile_file(argv[1]).items():
            print(fp_id, {k: round(v, 3) for k, v in roofline_accuracy(s).items()})
        return 0
    if argv[:1] == ["scaling"] and len(argv) >= 5:
        kind, measured_dir, small_dir = argv[1], Path(argv[2]), Path(argv[3])
        measured, small = load_sets(kind, measured_dir, None), load_sets(kind, small_dir, None)
        for model in argv[4:]:
            r = scaling_accuracy(model, kind, measured, small)
            print({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()})
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
