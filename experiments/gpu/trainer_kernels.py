"""Where a Trainer step's GPU time goes, beside plain PyTorch's step of the same module: the
kernels of a few profiled steps of each, grouped by kind and by name (issue 44 item 6: why
ResNet-50's all-fast Trainer step is slower than eager).

Both sides run the same module, optimizer (SGD momentum 0.9) and batches as trainer_bench.py;
ours all fast (no budget) in the Trainer's default GPU mode (replayed from a CUDA graph: the
CUPTI trace sees a replay's kernels). Per side: the wall time per step, the GPU's busy time
(union of every kernel and copy interval) and the kernel time summed, then a table of kernel
kinds (convolution forward, data and weight gradients, normalisation, elementwise, ...) and
the top kernels by time, per step.

Usage (GPU machine, repository root, the wheels of setup.sh carried):
    python3 experiments/gpu/trainer_kernels.py OUT.json --model resnet50 --batch 64 [--top 25] \
        [--share 0.5] [--copies]
The last part names the lines of ours that launch the copies of one more step (a replayed
step's copies run inside the graph and are named by the replay).

Beside the measured side, what the simulator predicted of the same plan (`predicted_breakdown`):
its step, the kernels' and re-runs' time summed, the time the GPU is predicted to wait (for
copies), the copies' time and bytes each way and the kernels by op type: put beside the
measured kernel sum, busy time and copy time, it says which of them a prediction misses
(issue 46 item 5). `--precision bf16` (default, the Trainer's on a GPU): ours in bf16, the
eager side under torch.autocast; `--budget BYTES`: a budget in bytes instead of `--share`
(bf16_bench.sh's budgets.json); `--plan-out FILE`: the plan, to simulate again on the CPU;
`AUTOTM_PROFILES=DIR` keeps the kernel profiles measured on the way where they can be brought
back. Last, where ours' step spends its host time (`host_phases`, `ours_host_ms`): the
executor's `prepare` (before a replay `prepare_replay`), the replay's launch, and the rest to
the loss read; and which ops' outputs the first step copies into their slots (`slot_copies`,
`ours_slot_copies`: the copies a replay repeats, which a trace names only as the replay's).
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "gpu"))

import trainer_bench as tb  # noqa: E402

from autotm_py.runtime.device_trace import activity_of, device_events  # noqa: E402
from autotm_py.runtime.memory import same_place  # noqa: E402
from autotm_py.trainer import Trainer  # noqa: E402

# the first pattern a kernel's name matches names its kind (cuDNN and CUTLASS names)
KINDS = (("copy", r"^Memcpy|^Memset"),
         # transformers' (transformer_compare.py): before "gemm" (fmha kernels are CUTLASS's)
         # and "batch norm" (layer norm kernels are Welford's)
         ("attention", r"fmha|flash|attention|_efficient_attention|mem_eff"),
         ("layer norm", r"layer_norm|layernorm|GammaBeta|rms_norm|RowwiseMoments"),
         ("conv weight grad", r"wgrad|dgrad_wgrad|_wgrad|bwd_filter|convolve_w|wgrad_"),
         ("conv data grad", r"dgrad|bwd_data"),
         ("conv forward", r"fprop|implicit_convolve|conv2d|xmma|implicit_gemm|convolve"),
         ("batch norm", r"batch_norm|bn_|batchnorm|welford"),
         ("gemm", r"gemm|sm90_|cutlass|ampere_sgemm|cublas"),
         ("optimizer (multi-tensor)", r"multi_tensor|foreach"),
         ("pooling", r"pool"),
         ("softmax / loss", r"softmax|nll|cross_entropy|log_softmax"),
         ("reduction", r"reduce"),
         ("elementwise", r"elementwise|vectorized|unrolled|CatArray|copy_kernel|fill"),
         ("other", r"."))


def kind_of(name: str) -> str:
    return next(kind for kind, pattern in KINDS if re.search(pattern, name, re.IGNORECASE))


def profiled(step, batches) -> dict:
    """Wall time per step and the device events of `batches` steps, profiled."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        started = time.perf_counter()
        for x, y in batches:
            float(step(x, y))
        torch.cuda.synchronize()
        wall = (time.perf_counter() - started) / len(batches)
    events = device_events(prof)
    activity = activity_of(events)
    n = len(batches)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for name, _, duration in events:
        by_name[name][0] += 1
        by_name[name][1] += duration / 1e6
    by_kind: dict[str, float] = defaultdict(float)
    for name, (_, total) in by_name.items():
        by_kind[kind_of(name)] += total / n
    return {"wall_ms": wall * 1e3, "busy_ms": activity.busy_s * 1e3 / n,
            "kernel_ms": activity.kernel_s * 1e3 / n, "copy_ms": activity.copy_s * 1e3 / n,
            "kinds_ms": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
            "kernels": sorted(({"name": name, "per_step": count / n, "ms": total / n,
                                "kind": kind_of(name)}
                               for name, (count, total) in by_name.items()),
                              key=lambda k: -k["ms"])}


def copy_sources(step, batch) -> dict[str, dict[str, int]]:
    """Which lines of ours (the innermost autotm_py frame, else the op) launch the copies of
    one profiled step: {copy kind: {line: launches}}."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, with_stack=True) as prof:
        float(step(*batch))
        torch.cuda.synchronize()
    found: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for event in prof.events():
        for kernel in getattr(event, "kernels", []):
            if kernel.name.startswith("Memcpy"):
                ours = [f for f in (event.stack or []) if "autotm_py" in f]
                found[kernel.name][ours[0] if ours else event.name] += 1
    return {kind: dict(sorted(lines.items(), key=lambda kv: -kv[1])[:12])
            for kind, lines in found.items()}


def slot_copies(trainer, batch, losses: list[float] | None = None) -> dict[str, int]:
    """The outputs the executor copies into their slots in the Trainer's first step (eager,
    before the capture: a replay gives no Python frames to the profiler), by the op of the
    record that copies them ("carried, at the end": `Executor._steady`): {op: copies}. Call
    before the first step; its loss is appended to `losses`. ResNet-200 b64 bf16 all fast
    replayed 2,033 device-to-device copies a step, 2.1 ms (H200, 2026-12-04)."""
    ex = trainer.loop.executor
    found: dict[str, int] = defaultdict(int)
    in_slot = ex._in_slot
    ending = [False]

    def counted(value, slot):
        if value is not slot and not same_place(value, slot):
            record = ex.plan.records[ex.index] if 0 <= ex.index < len(ex.plan.records) else None
            kernel = getattr(record, "kernel", None)
            op = "carried, at the end" if ending[0] else \
                ex.graph.kernels[kernel].op_type if kernel is not None else "?"
            found[op] += 1
        return in_slot(value, slot)

    def finish():
        ending[0] = True
        try:
            return type(ex).finish(ex)
        finally:
            ending[0] = False
    ex._in_slot, ex.finish = counted, finish
    try:
        loss = float(trainer.step(*batch))
        if losses is not None:
            losses.append(loss)
    finally:
        del ex._in_slot, ex.finish
    return dict(sorted(found.items(), key=lambda kv: -kv[1]))


def host_phases(trainer, batches) -> dict[str, float]:
    """Where the host spends a Trainer step, ms per step over `batches` (unprofiled): the
    executor's `prepare` (placing the iteration's initial tensors), the replay's launch of the
    captured graph (or the eager run's enqueueing), and the rest of the step to its loss read
    (the wait for the GPU among it). The GPU idles while the first two run after a step whose
    loss was read: ResNet-200 b64 bf16 all fast idled it 7 ms a step (H200, 2026-12-04)."""
    loop = trainer.loop
    spent = defaultdict(float)

    def timed(name, function):
        def wrapper(*a, **kw):
            started = time.perf_counter()
            try:
                return function(*a, **kw)
            finally:
                spent[name] += time.perf_counter() - started
        return wrapper

    # the methods wrapped on the instances for these steps, the classes' own after
    wrapped = [(loop.executor, "prepare", "prepare"), (loop.executor, "prepare_replay", "prepare"),
               (loop.executor, "run", "launch")]
    if hasattr(loop.driver, "replay"):
        wrapped.append((loop.driver, "replay", "launch"))
    for owner, method, phase in wrapped:
        setattr(owner, method, timed(phase, getattr(owner, method)))
    try:
        started = time.perf_counter()
        for x, y in batches:
            float(trainer.step(x, y))
        total = time.perf_counter() - started
    finally:
        for owner, method, _ in wrapped:
            delattr(owner, method)
    n = len(batches)
    return {"step_ms": total * 1e3 / n, "prepare_ms": spent["prepare"] * 1e3 / n,
            "launch_ms": spent["launch"] * 1e3 / n,
            "rest_ms": (total - spent["prepare"] - spent["launch"]) * 1e3 / n}


def trainer_step(net, loss_fn, data, args):
    cap = {"budget": args.budget} if args.budget else {"ratio": tb.ratio_of(args.share)}
    trainer = Trainer(net, tb.sgd(net.parameters()), loss_fn, example=data[0], **cap,
                      device="cuda", time_limit_s=60, plans_dir=tempfile.mkdtemp(),
                      loss_chunks=args.loss_chunks, precision=args.precision,
                      mode=tb.COPIES_MODE if args.copies else None)
    ops: dict[str, int] = defaultdict(int)
    for kernel in trainer.graph.kernels:
        ops[kernel.op_type] += 1
    return trainer.step, trainer, dict(sorted(ops.items(), key=lambda kv: -kv[1]))


def side_by_side(title: str, e: dict | None, o: dict,
                 names: tuple[str, str] = ("eager", "ours")) -> list[str]:
    """Wall, busy and kernel-sum times of two profiled sides (`profiled`), then their kernel
    kinds side by side; `e` None: the second side alone (`--no-eager`)."""
    shown = [(n, s) for n, s in zip(names, (e, o), strict=True) if s is not None]
    width = max(len(n) for n, _ in shown)
    lines = [f"{title}: wall / busy / kernel-sum ms per step"]
    lines += [f"  {n:<{width}} {s['wall_ms']:.2f} / {s['busy_ms']:.2f} / {s['kernel_ms']:.2f}"
              for n, s in shown]
    if e is None:
        lines.append(f"  kind | {names[1]} ms")
        lines += [f"  {kind} | {ms:.2f}" for kind, ms in o["kinds_ms"].items()]
        return lines
    lines.append(f"  kind | {names[0]} ms | {names[1]} ms | {names[1]} - {names[0]}")
    for kind in dict.fromkeys([*e["kinds_ms"], *o["kinds_ms"]]):
        a, b = e["kinds_ms"].get(kind, 0.0), o["kinds_ms"].get(kind, 0.0)
        lines.append(f"  {kind} | {a:.2f} | {b:.2f} | {b - a:+.2f}")
    return lines


def table(result: dict, top: int) -> list[str]:
    lines = side_by_side(f"{result['model']} b{result['batch']}, ours "
                         f"{result.get('ours_describe')}", result["eager"], result["ours"])
    for side in (s for s in ("eager", "ours") if result[s] is not None):
        lines.append(f"top kernels, {side}: ms per step, launches per step, name")
        lines += [f"  {k['ms']:7.3f} {k['per_step']:5.0f}  {k['name'][:110]}"
                  for k in result[side]["kernels"][:top]]
    for kind, found in result.get("ours_copy_sources", {}).items():
        lines.append(f"ours, one step: {kind} launched by")
        lines += [f"  {n:5d}  {line}" for line, n in found.items()]
    lines.append("ours, graph ops: " + ", ".join(f"{op} {n}" for op, n in result["ops"].items()))
    pred = result.get("ours_predicted")
    if pred:
        lines.append(f"ours predicted: step {pred['step_ms']:.2f} (all fast "
                     f"{pred['all_fast_ms']:.2f}), kernels {pred['kernel_ms']:.2f} + re-runs "
                     f"{pred['rerun_ms']:.2f}, waiting "
                     f"{pred['waiting_ms']:.2f}, copies ms {pred['copy_ms']} MB {pred['copy_mb']}")
        lines.append(f"  by op ms: {pred['ops_ms']}")
        lines.append(f"  re-runs ms: {pred['reruns_ms']}")
    return lines


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--model", default="resnet50",
                   choices=("resnet50", "resnet200", "gpt2", "bert"))
    p.add_argument("--precision", default="bf16", choices=("fp32", "bf16"))
    p.add_argument("--budget", type=int, default=None, help="bytes (instead of --share)")
    p.add_argument("--plan-out", default=None, help="write ours' plan there")
    p.add_argument("--region", type=int, default=None, help="bytes of the placed allocator's "
                   "region (bf16_bench.sh gives a capped process its budget); default: the "
                   "GPU's free memory")
    p.add_argument("--no-eager", action="store_true", help="ours only")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--loss-chunks", type=tb.loss_chunks_arg, default=1,
                   help="blocks of the chunked loss, or auto (the Trainer's default)")
    p.add_argument("--steps", type=int, default=8, help="steps before the profiled ones")
    p.add_argument("--profiled", type=int, default=5)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--share", type=float, default=1.0, help="of the peak: 1 = all fast")
    p.add_argument("--copies", action="store_true", help="the Trainer on torch's allocator, "
                   "its outputs copied into their slots (trainer_bench.py --copies)")
    args = p.parse_args(argv)
    torch.backends.cudnn.benchmark = False
    tb.use_replay_work_queues()
    if not args.copies:
        print("\n".join(tb.prepare_cuda("cuda", tb.PLACED_MODE, args.region)) or "placed",
              flush=True)
    net, loss_fn, data = tb.model_and_data(args.model, args.batch, args.seq,
                                           args.steps + args.profiled, pin=True)
    warm, timed = data[:args.steps], data[args.steps:]
    result = {"model": args.model, "batch": args.batch, "device": torch.cuda.get_device_name()}
    result["eager"] = None
    if not args.no_eager:
        step = tb.eager_step(copy.deepcopy(net), loss_fn, "cuda", args.precision)
        tb.timed_steps(step, warm)
        result["eager"] = profiled(step, timed)
        del step
        torch.cuda.empty_cache()
    step, trainer, result["ops"] = trainer_step(copy.deepcopy(net), loss_fn, data, args)
    result["ours_slot_copies"] = slot_copies(trainer, data[0])
    _, seconds = tb.timed_steps(step, warm)
    result["ours_unprofiled_ms"] = statistics.median(seconds[3:] or seconds) * 1e3
    result["ours_host_ms"] = host_phases(trainer, timed)
    result["ours"] = profiled(step, timed)
    result["ours_predicted_ms"] = trainer.plan.header.predicted_time_s * 1e3
    result["ours_replayed"] = bool(trainer.loop.driver.replayed)
    result["ours_describe"] = trainer.describe()
    result["ours_loss_chunks"] = trainer.graph.meta["training"].get("loss_chunks", 1)
    result["ours_notes"] = trainer.notes
    result["ours_copy_sources"] = copy_sources(step, data[-1])
    result["ours_predicted"] = tb.predicted_breakdown(trainer)
    if args.plan_out:
        trainer.plan.save(args.plan_out)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print("\n".join(table(result, args.top)))
    print("ours, outputs copied into their slots, first step: " + ", ".join(
        f"{op} {n}" for op, n in result["ours_slot_copies"].items()))
    print("ours, host per step (ms): " + ", ".join(
        f"{k[:-3]} {v:.2f}" for k, v in result["ours_host_ms"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
