"""A GPT decoder whose weights and optimizer state do not fit the cap, trained through
`autotm_py.Trainer` (issue 49 items 1 and 3), beside what PyTorch offers on one GPU.

The model is defined here (no hub): a pre-LN GPT decoder (`trainer_bench.GPT2`: tied token
embedding, `scaled_dot_product_attention`, tanh GELU), bf16 autocast with fp32 master weights,
AdamW (lr 1e-4, weight decay 0.1). Default size: d=3072, 28 layers, 24 heads, vocabulary 50257,
sequence 2048: 3.33B parameters, 53 GB of fp32 weights, gradients and Adam state, so under a
24 GiB cap most of them must live in pinned host memory and stream in and out.

One part per process (`--part`), because the Trainer's placed allocator leaves torch's memory
caps without effect in its process:
- `ours`: `Trainer(module, AdamW, lm_loss, example, budget=CAP, precision="bf16",
  loss_chunks=16, optimizer_on=...)` on the GPU; the plan decides what stays in HBM and what
  streams; `--optimizer-on gpu` updates on the GPU on streamed state, `host` on the host's
  cores as the gradients come out (`trainer.host`), `split` the host the first gradients'
  and the GPU the last ones' (`--host-share`, or the planner's cut), `auto` (default)
  whichever the planner predicts fastest where the weights and optimizer state exceed the
  cap (all three planned);
- `uncapped`: the same module under `torch.autocast("cuda", torch.bfloat16)`, AdamW
  (fused) on the GPU, no cap: the speed of unlimited memory where it fits the H200;
- `fsdp`: FSDP2 (`fully_shard`) on one GPU with `CPUOffloadPolicy` (parameters, gradients and
  AdamW state in pinned host memory, the optimizer step on the CPU), bf16 parameters through
  `MixedPrecisionPolicy`, each block activation-checkpointed, under the same cap
  (`set_per_process_memory_fraction`, budget + 64 MiB as the other benchmarks).
Every part runs `--steps` steps on the same seeded batches from the same seeded weights and
writes step times (median after the first three), tokens/s, the loss of every step, the
process's peak host memory (VmHWM) and the GPU's reserved peak to OUT.json as it goes, and
`host_memory`: the process's resident bytes, the host's MemAvailable and torch's pinned host
bytes at each phase (module built, Trainer set up, steps 1 and 2, done) and the lowest
MemAvailable seen (`HostMemory`).

Seen on an H200 (2026-12-04, experiments/results/beyond_card/2026-12-04/calls.txt): building
and capturing the 3.33B model ~3 min, its 59 kernels profiled in seconds, the solve and the
arena's fit loop ~5 min at `--time-limit 150` (four solves); uncapped 0.40 s a step at batch 4,
FSDP 6.4 s. Since the skyline packing (docs/planning.md, 2026-12-04 seventh session) the
first solve's plan should pack (the same decoder cut to 6 layers does on the CPU: one solve
instead of two), so `ours` should plan in about `--time-limit` seconds; not yet seen on the
H200. Run one part per device command; carry the profile and plan caches between calls
(`XDG_CACHE_HOME`, `--plans`) so that a rerun of `ours` starts without solving.

    python3 experiments/gpu/beyond_card.py OUT.json --part ours --cap 24GiB [--steps 20]
        [--optimizer-on gpu|host|auto]
    python3 experiments/gpu/beyond_card.py OUT.json --part uncapped
    python3 experiments/gpu/beyond_card.py OUT.json --part fsdp --cap 24GiB
    python3 experiments/gpu/beyond_card.py OUT.json --small --part ours   # CPU smoke test
`--mode eager`: ours on torch's caching allocator capped at the budget instead of the arena
(it ran out of memory in its first step at 24 GiB). `--size medium`: a 0.3B model, to follow
host memory on a CPU.
`--small`: a 4-layer, 128-wide model on the CPU (fsdp is not run there): checks the script.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "gpu"))

from trainer_bench import GPT2, lm_loss  # noqa: E402

from autotm_py.options import RunMode  # noqa: E402
from autotm_py.units import parse_bytes  # noqa: E402

SLACK = 64 << 20  # caps are budget + 64 MiB, as trainer_bench.py and native_compare.py
SIZES = {"3b": {"dim": 3072, "layers": 28, "heads": 24, "seq": 2048, "vocab": 50257},
         # 5.12B: its weights, gradients and AdamW state (82 GB) exceed an 80 GB card
         "5b": {"dim": 3584, "layers": 32, "heads": 28, "seq": 2048, "vocab": 50257},
         # 5.85B: 94 GB of fp32 state; ~119 GB of host memory with the pool pinned at its own
         # size (the 5.12B decoder took 20.4 bytes a parameter beside its pool's rounding)
         "6b": {"dim": 4096, "layers": 28, "heads": 32, "seq": 2048, "vocab": 50257},
         # 6.66B: ~121 GB of host memory estimated with the module sharing the host's masters
         # (its own 4 bytes a parameter freed); not yet run
         "7b": {"dim": 4096, "layers": 32, "heads": 32, "seq": 2048, "vocab": 50257},
         # 8.26B: 132 GB of fp32 state; at the whole card of an H100 80GB (76 GiB) the 6.66B
         # decoder left 73 GB of the host's 134 GB free (2026-12-06)
         "8b": {"dim": 4096, "layers": 40, "heads": 32, "seq": 2048, "vocab": 50257},
         "small": {"dim": 128, "layers": 4, "heads": 4, "seq": 64, "vocab": 512},
         "medium": {"dim": 1536, "layers": 8, "heads": 12, "seq": 512, "vocab": 50257}}


class HostMemory:
    """Where host memory goes: marks at named phases (this process's resident bytes, the
    host's MemAvailable, and on a GPU the bytes torch's pinned host allocator holds), and the
    lowest MemAvailable seen, sampled every `every` seconds on a thread. The 5.12B decoder's
    steps took about 18 GB more than the pinned pool, the AdamW state and the module account
    for (2026-12-05, eleventh session): torch's pinned allocator rounds the pool up to a power
    of two (`runtime.pinned.pinned_footprint`); these marks show such gaps by phase."""

    def __init__(self, every: float = 1.0) -> None:
        from autotm_py.runtime.pinned import available_host_bytes

        self.available = available_host_bytes
        self.marks: list[dict[str, Any]] = []
        self.low: dict[str, Any] = {}
        self._stop = threading.Event()
        self._began = time.perf_counter()
        threading.Thread(target=self._sample, args=(every,), daemon=True).start()

    def _sample(self, every: float) -> None:
        while not self._stop.wait(every):
            free = self.available()
            if free is not None and free < self.low.get("available", free + 1):
                self.low = {"available": free, "at_s": time.perf_counter() - self._began,
                            "after": self.marks[-1]["phase"] if self.marks else None}

    def mark(self, phase: str) -> None:
        entry: dict[str, Any] = {"phase": phase, "at_s": time.perf_counter() - self._began,
                                 "rss": _status_bytes("VmRSS"),
                                 "available": self.available()}
        if torch.cuda.is_available() and hasattr(torch.cuda, "host_memory_stats"):
            stats = torch.cuda.host_memory_stats()
            entry["torch_pinned"] = stats.get("allocated_bytes.current",
                                              stats.get("reserved_bytes.current"))
        self.marks.append(entry)
        print(f"host memory, {phase}: " + ", ".join(
            f"{k} {v / 1e9:.1f} GB" for k, v in entry.items()
            if k not in ("phase", "at_s") and v is not None), flush=True)

    def record(self) -> dict[str, Any]:
        self._stop.set()
        return {"marks": self.marks, "lowest_available": self.low}


def _status_bytes(key: str) -> int | None:
    """A byte count of /proc/self/status (VmRSS, VmHWM); None where there is none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def build(size: dict[str, int], batch: int, steps: int):
    """(module, batches on the CPU), seeded: every part trains the same weights on the same
    data."""
    torch.manual_seed(0)
    net = GPT2(vocab=size["vocab"], dim=size["dim"], layers=size["layers"],
               heads=size["heads"], seq=size["seq"])
    # GPT-2's initialisation of the tied embedding (torch's N(0, 1) makes logits of std
    # sqrt(dim) and a first loss in the hundreds)
    for table in (net.emb.weight, net.pos.weight):
        torch.nn.init.normal_(table, std=0.02)
    gen = torch.Generator().manual_seed(1)
    tokens = [torch.randint(0, size["vocab"], (batch, size["seq"] + 1), generator=gen)
              for _ in range(steps)]
    return net, [(t[:, :-1].contiguous(), t[:, 1:].contiguous()) for t in tokens]


def cap_fraction(cap: int, device: str) -> None:
    """torch's caching allocator capped at `cap` + SLACK bytes."""
    torch.cuda.set_per_process_memory_fraction(
        min(1.0, (cap + SLACK) / torch.cuda.get_device_properties(device).total_memory))


def adamw(params, fused: bool = False):
    return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, fused=fused)


def timed(step, data) -> dict[str, Any]:
    losses, seconds = [], []
    for x, y in data:
        start = time.perf_counter()
        losses.append(float(step(x, y)))
        seconds.append(time.perf_counter() - start)
        # as it goes: a call cut short still says what it measured
        print(f"step {len(losses)}: loss {losses[-1]:.4f}, {seconds[-1]:.3f} s", flush=True)
    return {"losses": losses, "step_s": statistics.median(seconds[3:] or seconds),
            "seconds": seconds}


def ours(net, data, args, memory: HostMemory) -> dict[str, Any]:
    from autotm_py.trainer import Trainer

    started = time.perf_counter()
    mode = None  # the Trainer's default: an arena, the placed allocator, replayed
    if args.mode == "eager":  # torch's caching allocator, capped as the natives are
        mode = RunMode(placed=False)
        if args.device == "cuda":
            cap_fraction(parse_bytes(args.cap), args.device)
    trainer = Trainer(net, adamw(net.parameters()), lm_loss, example=data[0],
                      budget=args.cap, device=args.device, precision="bf16", mode=mode,
                      loss_chunks=args.loss_chunks, time_limit_s=args.time_limit,
                      plans_dir=args.plans or tempfile.mkdtemp(),
                      optimizer_on=args.optimizer_on, host_share=args.host_share)
    setup_s = time.perf_counter() - started
    memory.mark("trainer set up")
    print(f"setup {setup_s:.0f} s; {trainer.describe()}; predicted "
          f"{trainer.plan.header.predicted_time_s * 1e3:.1f} ms", flush=True)
    host_timings: list[dict[str, float]] = []

    def step(x, y):
        loss = trainer.step(x, y)
        if trainer.host is not None and trainer.host.last_timing:  # the step before's
            host_timings.append(trainer.host.last_timing)
            print("  host, the step before: " + ", ".join(
                f"{k} {v * 1e3:.1f} ms" for k, v in trainer.host.last_timing.items()),
                flush=True)
        if trainer.steps <= 2:  # the first eager step (the host's state made), the capture
            memory.mark(f"step {trainer.steps}")
        return loss
    row = timed(step, data)
    plan = trainer.plan
    return row | {"setup_s": setup_s, "budget_bytes": plan.header.budget_bytes,
                  "peak_bytes": trainer.graph.peak_live_bytes,
                  "predicted_s": plan.header.predicted_time_s,
                  "status": plan.header.solver.status, "describe": trainer.describe(),
                  "optimizer_on": trainer.optimizer_on, "notes": trainer.notes,
                  # the host's predicted work and when the GPU's part ends (`host_note`)
                  "plan_notes": list(plan.header.notes),
                  "host_bytes": trainer.host_bytes,
                  "host_timings": host_timings}


def uncapped(net, data, device: str) -> dict[str, Any]:
    net = net.to(device).train()
    opt = adamw(net.parameters(), fused=device.startswith("cuda"))

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16):
            out = net(x.to(device))
        loss = lm_loss(out.float(), y.to(device))
        loss.backward()
        opt.step()
        return loss.detach()
    return timed(step, data)


def fsdp_offload(net, data, cap: int, device: str) -> dict[str, Any]:
    """FSDP2 on one GPU with CPU offload, each block checkpointed, under the cap."""
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1)
    cap_fraction(cap, device)
    policy = {"offload_policy": CPUOffloadPolicy(),
              "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                reduce_dtype=torch.float32)}
    net.checkpointed = True
    for block in net.blocks:
        fully_shard(block, **policy)
    fully_shard(net, **policy)
    opt = adamw(net.parameters())

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(net(x.to(device)).float(), y.to(device))
        loss.backward()
        opt.step()
        return loss.detach()
    try:
        return timed(step, data)
    except torch.OutOfMemoryError as e:
        return {"out_of_memory": str(e).splitlines()[0]}
    finally:
        dist.destroy_process_group()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--part", choices=("ours", "uncapped", "fsdp"), required=True)
    p.add_argument("--cap", default="24GiB", help="fast-memory budget (ours) and cap (fsdp)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--loss-chunks", type=int, default=16)
    p.add_argument("--mode", choices=("arena", "eager"), default="arena",
                   help="ours: the Trainer's default run mode (arena), or eager on torch's "
                   "caching allocator capped at --cap (no arena to pack)")
    p.add_argument("--time-limit", type=float, default=300.0, help="solver seconds")
    p.add_argument("--plans", help="plan cache folder (a second run starts without solving)")
    p.add_argument("--optimizer-on", choices=("gpu", "host", "split", "auto"), default="auto",
                   help="ours: where the AdamW updates run (the Trainer's optimizer_on)")
    p.add_argument("--host-share", type=float, default=None,
                   help="ours, --optimizer-on split: the share of the parameters the host "
                   "updates (the Trainer's host_share; default: the planner's cut)")
    p.add_argument("--small", action="store_true", help="tiny model on the CPU")
    p.add_argument("--size", choices=tuple(SIZES), default="3b",
                   help="3b (default); 5b: 5.12B, more state than an 80 GB card holds; 6b: "
                   "5.85B; 7b: 6.66B; 8b: 8.26B; medium: "
                   "0.3B, to follow host memory on a CPU")
    args = p.parse_args(argv)
    # the minutes of a 3B capture, profile and solve, stamped as they pass
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    size = SIZES["small" if args.small else args.size]
    args.device = "cpu" if args.small or not torch.cuda.is_available() else "cuda"
    if args.small:
        args.cap = "3MiB"
    if args.part == "fsdp" and args.small:
        p.error("--part fsdp needs a GPU (FSDP2's CPU offload)")
    # before CUDA starts: the placed allocator
    if args.part == "ours" and args.device == "cuda" and args.mode == "arena":
        from autotm_py.pipeline import prepare_cuda
        from autotm_py.trainer.loop import GPU_MODE

        print("\n".join(prepare_cuda("cuda", GPU_MODE, None)) or "placed allocator", flush=True)
    memory = HostMemory()
    memory.mark("start")
    net, data = build(size, args.batch, args.steps)
    memory.mark("module built")
    params = sum(t.numel() for t in net.parameters())
    result: dict[str, Any] = {"part": args.part, "size": size, "batch": args.batch,
                              "params": params, "cap": args.cap, "args": vars(args) | {
                                  "out": str(args.out)}}
    print(f"{params / 1e9:.2f}B parameters, {args.part}", flush=True)
    if args.part == "ours":
        row = ours(net, data, args, memory)
    elif args.part == "uncapped":
        row = uncapped(net, data, args.device)
    else:
        row = fsdp_offload(net, data, parse_bytes(args.cap), args.device)
    memory.mark("steps done")
    row["host_peak_bytes"] = _status_bytes("VmHWM")  # pinned buffers included
    row["host_memory"] = memory.record()
    if args.device == "cuda":
        from autotm_py.runtime.device import peaks

        row["gpu_peaks_bytes"] = list(peaks("cuda"))
    if "step_s" in row:
        row["tokens_per_s"] = args.batch * size["seq"] / row["step_s"]
    result[args.part] = row
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in row.items() if k not in ("losses", "seconds")}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
