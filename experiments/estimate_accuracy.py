"""How good are the estimates? Roofline and batch-scaling accuracy against measured profiles.

    python experiments/estimate_accuracy.py roofline profiles/h100-80gb-hbm3.json
    python experiments/estimate_accuracy.py scaling cuda MEASURED_DIR SMALL_DIR resnet50 ...

`roofline` compares every entry of a profile file with the roofline estimate of its own set.
`scaling` plans each zoo model (training, default batch) from the profiles in SMALL_DIR (taken
at a smaller batch) and compares the batch-scaled kernels with their times in MEASURED_DIR.
The numbers in docs/profiling.md were made this way.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from autotm_py import api
from autotm_py.profiling.cache import load_sets, read_profile_file
from autotm_py.profiling.validate import roofline_accuracy, scaling_accuracy


def main(argv: Sequence[str]) -> int:
    if argv[:1] == ["roofline"] and len(argv) == 2:
        for fp_id, s in read_profile_file(argv[1]).items():
            print(fp_id, {k: round(v, 3) for k, v in roofline_accuracy(s).items()})
        return 0
    if argv[:1] == ["scaling"] and len(argv) >= 5:
        kind, measured_dir, small_dir = argv[1], Path(argv[2]), Path(argv[3])
        measured, small = load_sets(kind, measured_dir, None), load_sets(kind, small_dir, None)
        for model in argv[4:]:
            graph = api.load_model(model, training=True)
            r = scaling_accuracy(graph, kind, measured, small)
            print({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()})
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
