"""How long is the GPU busy in an iteration, against its wall time?

Kernel times in the profiles are CUDA-event intervals, which include the gaps where the GPU
waited for Python to launch the next kernel. This runs one iteration of each cell under the
torch profiler (CUDA activity) after warm-up iterations and sums the device durations of the
kernels and of the copies: what the GPU itself spends. Wall minus kernel time is launch gaps
(and waits); a plan whose copies occupy the GPU lets the host run ahead into them.

Each IR kernel runs inside a profiler range, so the device time of every kernel comes out too
($OUT/device_times_CELL.json, seconds by kernel id): `host_replay.py --device-times` prices the
kernels on the GPU clock with them.

Usage (on the GPU machine):
  python3 experiments/gpu/gpu_busy.py densenet264:32:1-1:all-fast densenet264:32:1-1:sync:0.15
Cells are MODEL:BATCH:RATIO:STRATEGY[:HEADROOM] (STRATEGY all-fast: every tensor on the GPU,
uncapped); results go to $OUT/gpu_busy.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
RANGE = "autotm-kernel-"


def main() -> None:
    out = Path(os.environ.get("OUT", "/tmp"))
    rows = [busy(cell, out) for cell in sys.argv[1:]]
    (out / "gpu_busy.json").write_text(json.dumps(rows, indent=1))


def busy(cell: str, out: Path) -> dict:
    import torch
    from diagnose import _plan_path
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from autotm_py import api
    from autotm_py.plan import Plan
    from autotm_py.profiling.in_context import all_fast_plan
    from autotm_py.runtime.executor import Executor, _apply_cap, _new_executor, time_region

    class RangedExecutor(Executor):
        """Each kernel in a profiler range named after its id: the range's device time is
        the device time of the CUDA kernels it launched."""

        def compute(self, record) -> None:
            with torch.profiler.record_function(f"{RANGE}{record.kernel}"):
                super().compute(record)

    model, batch, ratio, strategy, *rest = cell.split(":")
    graph = api.load_model(model, batch=int(batch), training=True)
    plan = all_fast_plan(graph) if strategy == "all-fast" else Plan.load(
        _plan_path(model, int(batch), {}, ratio.replace("-", ":"), strategy,
                   float(rest[0]) if rest else 0.0))
    dev, executor = _new_executor(graph, plan, "cuda:0", seed=0, deterministic=False)
    cap = _apply_cap(plan, dev, enforce=strategy != "all-fast", slack=64 << 20)
    try:
        for _ in range(3):
            executor.prepare()
            plain = time_region(executor.device, executor.run)
        executor.__class__ = RangedExecutor  # ranges cost host time: not in the timed runs
        executor.prepare()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            executor.run()
            torch.cuda.synchronize()
    finally:
        if cap is not None:
            torch.cuda.set_per_process_memory_fraction(1.0, 0)
    kernels = copies = 0.0
    per_kernel = [0.0] * len(graph.kernels)
    for event in prof.events():
        if event.name.startswith(RANGE):  # the host-side range (a device-side copy is skipped)
            if event.device_type == DeviceType.CPU:
                per_kernel[int(event.name[len(RANGE):])] += _device_seconds(event)
            continue
        if event.device_type != DeviceType.CUDA:
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


def _device_seconds(event) -> float:
    # torch >= 2.4 names it device_time_total; older versions cuda_time_total (microseconds)
    total = getattr(event, "device_time_total", None)
    return (total if total is not None else event.cuda_time_total) / 1e6


if __name__ == "__main__":
    main()
