"""Add device times measured by `gpu_busy.py` to a model's in-context entries in a profile file.

`autotm profile --in-context` now measures device times itself; the DenseNet-264 and ResNet-200
entries shipped in profiles/h100-80gb-hbm3.json were measured before it did, and their device
times were measured separately (`gpu_busy.py`, experiments/results/validation/
device_times_*_b32.json, per kernel id of the all-fast iteration). This writes each signature's
median over its instances into the model's in-context entries, as in_context.py would.

Usage (CPU):
  python experiments/gpu/import_device_times.py MODEL BATCH TIMES.json [DIM=VALUE...] [--no-fuse]
  python experiments/gpu/import_device_times.py bert_base 16 device_times.json seq=512
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

PROFILE = Path(__file__).resolve().parents[2] / "profiles" / "h100-80gb-hbm3.json"


def main() -> None:
    from autotm_py import api
    from autotm_py.profiling.cache import read_profile_file, write_entries
    from autotm_py.profiling.in_context import per_signature_median
    from autotm_py.profiling.sources import in_context_placement

    model, batch, times_file = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    dims = dict((k, int(v)) for k, v in (a.split("=") for a in sys.argv[4:] if "=" in a))
    # device times measured before issue 15 are of the unfused graphs: --no-fuse
    graph = api.load_model(model, batch=batch, dims=dims, training=True,
                           fuse="--no-fuse" not in sys.argv[4:])
    per_kernel = json.loads(times_file.read_text())
    if len(per_kernel) != len(graph.kernels):
        raise SystemExit(f"{times_file}: {len(per_kernel)} kernels, {graph.name} has "
                         f"{len(graph.kernels)}: measured on another graph")
    device = per_signature_median(graph, per_kernel)
    (profile,) = read_profile_file(PROFILE, shipped=True).values()
    entries = {}
    for kernel in graph.kernels:
        placement = in_context_placement(graph, kernel)
        entry = profile.get(kernel.signature, placement)
        if entry is None:
            raise SystemExit(f"{PROFILE}: no in-context entry for {kernel.name} of {graph.name}")
        if kernel.signature in device:
            entries[kernel.signature] = {placement: replace(entry,
                                                            device_s=device[kernel.signature])}
    write_entries(PROFILE, profile.fingerprint, entries)
    print(f"{graph.name}: device times for {len(entries)} signatures into {PROFILE}")


if __name__ == "__main__":
    main()
