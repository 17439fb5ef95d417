"""How fast the host can run AdamW (issue 49 item 1: the optimizer step on the CPU): torch's
AdamW on fp32 parameters, gradients and moments in host memory, `foreach` (FSDP2's CPU
offload runs this one) and `fused`, on this machine's cores, in parameters per second; and
`host_side`: the Trainer's host updates (`trainer.host`: one fused AdamW per weight, the cast
of the new weight to bf16 timed apart, the per-update overhead of a tiny tensor), whose rates
are `MemorySystem.host_update_rate`, `host_cast_rate` and `HOST_UPDATE_OVERHEAD_S`.

    python3 experiments/gpu/cpu_adam_probe.py OUT.json [--billions 1.0] [--steps 4] [--busy-link]
        [--beside-spin]

`--busy-link` (a GPU machine): `host_side` again while two CUDA streams copy 1 GiB pinned
buffers to the GPU and back without pause, as a plan's weights, gradients and activations
cross the link while the host updates (the host's memory serves both): `host_side_busy_link`,
with the link's bytes a second meanwhile. `--beside-spin` (any machine): `host_side` on all of
torch's threads and on one fewer, each beside a process spinning on one core, as the thread
that waits for a GPU spins (`trainer.host.update_threads`): `host_side_beside_spin_N`.

The parameters are split in tensors of 3072 x 3072 (a 3B decoder's projection) so that the
time per parameter is that of a real model's update; the median of the steps after the first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

TILE = 3072 * 3072


def probe(variant: str, params: list[torch.Tensor], steps: int) -> dict[str, float]:
    for p in params:
        p.grad = torch.randn_like(p).mul_(1e-3)
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1,
                            **{variant: True})
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        opt.step()
        seconds.append(time.perf_counter() - start)
    numel = sum(p.numel() for p in params)
    step_s = statistics.median(seconds[1:] or seconds)
    del opt
    return {"step_s": step_s, "seconds": seconds, "params_per_s": numel / step_s}


def host_side(params: list[torch.Tensor], steps: int) -> dict[str, float]:
    """What `trainer.host.HostSide` does per weight: one fused AdamW per tensor stepping on
    its gradient, then the new weight cast to bf16 into a buffer the GPU reads (each timed
    apart), and the time of one update of a tiny tensor (a bias: the per-call overhead)."""
    opts = [torch.optim.AdamW([p], lr=1e-4, weight_decay=0.1, fused=True) for p in params]
    out = [torch.empty_like(p, dtype=torch.bfloat16) for p in params]
    bias = torch.zeros(3072)
    bias.grad = torch.randn(3072)
    tiny = torch.optim.AdamW([bias], lr=1e-4, fused=True)
    step, cast, small = [], [], []
    for _ in range(steps):
        start = time.perf_counter()
        for opt in opts:
            opt.step()
        middle = time.perf_counter()
        for p, o in zip(params, out, strict=True):
            o.copy_(p)
        step.append(middle - start)
        cast.append(time.perf_counter() - middle)
        start = time.perf_counter()
        for _ in range(100):
            tiny.step()
        small.append((time.perf_counter() - start) / 100)
    numel = sum(p.numel() for p in params)
    return {"params_per_s": numel / statistics.median(step[1:] or step),
            "cast_per_s": numel / statistics.median(cast[1:] or cast),
            "overhead_s": statistics.median(small[1:] or small),
            "step_seconds": step, "cast_seconds": cast}


def copying_both_ways(stop: threading.Event, moved: list[float], nbytes: int = 1 << 30) -> None:
    """Copy pinned host buffers to the GPU and back on two streams until `stop`; appends the
    bytes moved and the seconds taken to `moved`."""
    host_in = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    host_out = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev_in = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dev_out = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    h2d, d2h = torch.cuda.Stream(), torch.cuda.Stream()
    start, count = time.perf_counter(), 0
    while not stop.is_set():
        with torch.cuda.stream(h2d):
            dev_in.copy_(host_in, non_blocking=True)
        with torch.cuda.stream(d2h):
            host_out.copy_(dev_out, non_blocking=True)
        torch.cuda.synchronize()
        count += 2 * nbytes
    moved += [count, time.perf_counter() - start]


def beside_spin(params: list[torch.Tensor], steps: int, threads: int) -> dict[str, float]:
    """`host_side` on `threads` threads (a thread of its own, as the Trainer's updates run)
    while another process spins on a core."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    out: dict[str, float] = {}

    def work() -> None:
        torch.set_num_threads(threads)
        out.update(host_side(params, steps))
    try:
        time.sleep(0.5)
        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
    finally:
        spinner.kill()
    return out


def report(row: dict, key: str) -> None:
    """Print one probe's rates (not its per-step seconds) as it is measured."""
    print(key, json.dumps({k: v for k, v in row[key].items() if not k.endswith("seconds")}),
          flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--billions", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--busy-link", action="store_true",
                   help="host_side again while the GPU's link copies both ways")
    p.add_argument("--beside-spin", action="store_true",
                   help="host_side on all threads and one fewer beside a spinning process")
    args = p.parse_args()
    torch.manual_seed(0)
    params = [torch.randn(TILE).mul_(0.02) for _ in range(int(args.billions * 1e9) // TILE)]
    row = {"threads": torch.get_num_threads(), "cpus": os.cpu_count(),
           "params": sum(t.numel() for t in params)}
    for variant in ("foreach", "fused"):
        row[variant] = probe(variant, params, args.steps)
        report(row, variant)
    row["host_side"] = host_side(params, args.steps)
    report(row, "host_side")
    if args.busy_link:
        stop, moved = threading.Event(), []
        side = threading.Thread(target=copying_both_ways, args=(stop, moved))
        side.start()
        time.sleep(1.0)  # its buffers pinned and copies running
        row["host_side_busy_link"] = host_side(params, args.steps)
        stop.set()
        side.join()
        row["host_side_busy_link"]["link_bytes_per_s"] = moved[0] / moved[1]
        report(row, "host_side_busy_link")
    if args.beside_spin:
        everyone = torch.get_num_threads()
        for threads in sorted({everyone, max(1, everyone - 1)}, reverse=True):
            key = f"host_side_beside_spin_{threads}"
            row[key] = beside_spin(params, args.steps, threads)
            report(row, key)
    args.out.write_text(json.dumps(row, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
