"""How long is the GPU busy in an iteration, against its wall time?

Kernel times in the profiles are CUDA-event intervals, which include the gaps where the GPU
waited for Python to launch the next kernel. This runs one iteration of each cell under the
torch profiler (CUDA activity) after warm-up iterations and sums the device durations of the
kernels and of the copies: what the GPU itself spends. Wall minus kernel time is launch gaps
(and waits); a plan whose copies occupy the GPU lets the host run ahead into them.

Each IR kernel runs inside a profiler range, so the device time of every kernel comes out too
($OUT/device_times_CELL.json, seconds by kernel id; `import_device_times.py` puts them into a
profile, which `autotm profile --in-context` now does by itself).

Usage (on the GPU machine):
  python3 experiments/gpu/gpu_busy.py densenet264:32:1-1:all-fast densenet264:32:1-1:sync:0.15
Cells are MODEL:BATCH:RATIO:STRATEGY[:HEADROOM][:DIM=VALUE...] (STRATEGY all-fast: every
tensor on the GPU, uncapped; e.g. bert_base:16:1-1:all-fast:seq=512); results go to
$OUT/gpu_busy.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    out = Path(os.environ.get("OUT", "/tmp"))
    rows = [busy(cell, out) for cell in sys.argv[1:]]
    (out / "gpu_busy.json").write_text(json.dumps(rows, indent=1))


def busy(cell: str, out: Path) -> dict:
    import torch
    from diagnose import load_plan
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from autotm_py.profiling.in_context import kernel_device_times
    from autotm_py.runtime.device import apply_cap, release_cap, time_region
    from autotm_py.runtime.execute import new_executor
    from autotm_py.runtime.executor import KERNEL_RANGE

    model, batch, ratio, strategy, *rest = cell.split(":")
    dims = dict((k, int(v)) for k, v in (r.split("=") for r in rest if "=" in r))
    headroom = next((float(r) for r in rest if r and "=" not in r), 0.0)
    if strategy == "all-fast":  # the graph as imported today (fused), as profiles key it
        from autotm_py import api
        from autotm_py.pipeline import all_fast_plan

        graph = api.load_model(model, batch=int(batch), dims=dims or None, training=True)
        plan = all_fast_plan(graph)
    else:  # the kept plans of plan_all.sh (unfused graphs, diagnose.load_plan)
        graph, plan = load_plan(model, int(batch), dims, ratio.replace("-", ":"), strategy,
                                headroom)
    dev, executor, _ = new_executor(graph, plan, "cuda:0", seed=0, deterministic=False)
    cap = apply_cap(plan.header.budget_bytes, dev, enforce=strategy != "all-fast", slack=64 << 20)
    try:
        for _ in range(3):
            executor.prepare()
            plain = time_region(executor.device, executor.run)
        executor.kernel_ranges = True  # ranges cost host time: not in the timed runs
        executor.prepare()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            executor.run()
            torch.cuda.synchronize()
    finally:
        if cap is not None:
            release_cap(dev)
    kernels = copies = 0.0
    per_kernel = kernel_device_times(prof.events(), len(graph.kernels))
    for event in prof.events():
        if event.name.startswith(KERNEL_RANGE) or event.device_type != DeviceType.CUDA:
            continue
        seconds = event.time_range.elapsed_us() / 1e6
        if "memcpy" in event.name.lower():
            copies += seconds
        else:
            kernels += seconds
    (out / f"device_times_{cell.replace(':', '_')}.json").write_text(json.dumps(per_kernel))
    row = {"cell": cell, "wall_s": plain.seconds, "host_s": plain.host_seconds,
           "kernel_busy_s": kernels, "copy_busy_s": copies,
           "device_times_s": sum(per_kernel)}
    print(f"{cell:34s} wall {plain.seconds * 1e3:7.1f} ms  host {plain.host_seconds * 1e3:7.1f}"
          f"  GPU kernels {kernels * 1e3:7.1f}  copies {copies * 1e3:7.1f}  per-kernel sum "
          f"{sum(per_kernel) * 1e3:7.1f}", flush=True)
    return row


if __name__ == "__main__":
    main()
