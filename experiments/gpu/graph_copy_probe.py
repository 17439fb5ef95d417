"""Do host<->device copies cost the same inside a CUDA graph as eagerly, alone and overlapped
with compute? (Moving plans replayed as graphs ran 7-12% over their predictions on the H100
while the same plans run eagerly at planned addresses were predicted within 1-2%: docs/gpu.md.)

The executor's pattern, in miniature: matmuls on the capturing stream, a pinned host->device
copy on one side stream and a device->host copy on another, each forked from the compute stream
with an event and joined back with one. Timed eagerly and as a captured graph (CUDA events,
median of --repeats), for: compute alone, each copy alone, both copies, and compute with both
copies beside it. Prints a table and writes OUT/graph_copy_probe.json.

    python3 experiments/gpu/graph_copy_probe.py [--out DIR] [--mib 256] [--chunks 8]
        [--matmuls 16] [--size 2048]     (the defaults balance compute and copies on an H100)
        [--copy-bytes N] [--pool [--host-offset B] [--device-offset B]] [--d2d K]
        [--name FILE_STEM]

With --pool each side's buffers are views of one allocation, at an offset past a page boundary:
the executor's pinned pool and arena place tensors at 256- and 512-byte multiples, and most of
a plan's copies start off a page (the offsets of Inception-v4's copies: replay_profile.py
--copies).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch


def median_event_ms(fn, repeats: int, stream: torch.cuda.Stream | None = None,
                    warmup: int = 2) -> float:
    """Median milliseconds of `fn` between CUDA events on `stream` (the current one if None),
    after `warmup` untimed calls."""
    times = []
    for _ in range(repeats + warmup):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record(stream)
        fn()
        end.record(stream)
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times[warmup:])


def views(n: int, args: argparse.Namespace, offset: int, device: torch.device | None = None
          ) -> list[torch.Tensor]:
    """`args.chunks` buffers of `n` bytes in one allocation (pinned host memory unless a device
    is given), as the executor's pinned pool and arena hold tensors: the i-th at `offset` bytes
    past a 4096-byte boundary."""
    stride = -(-(n + offset) // 4096) * 4096
    pool = torch.empty(stride * args.chunks, dtype=torch.uint8, device=device,
                       pin_memory=device is None)
    return [pool[i * stride + offset:i * stride + offset + n] for i in range(args.chunks)]


class Probe:
    """Buffers and streams of the miniature iteration."""

    def __init__(self, args: argparse.Namespace) -> None:
        dev = torch.device("cuda")
        self.args = args
        self.compute = torch.cuda.Stream()
        self.h2d, self.d2h = torch.cuda.Stream(), torch.cuda.Stream()
        n = args.copy_bytes or args.mib * 2**20 // args.chunks
        if args.pool:
            self.host_in, self.host_out = (views(n, args, args.host_offset)
                                           for _ in range(2))
            self.dev_in, self.dev_out = (views(n, args, args.device_offset, device=dev)
                                         for _ in range(2))
        else:
            pinned = [torch.empty(n, dtype=torch.uint8, pin_memory=True)
                      for _ in range(2 * args.chunks)]
            self.host_in, self.host_out = pinned[:args.chunks], pinned[args.chunks:]
            self.dev_in = [torch.empty(n, dtype=torch.uint8, device=dev)
                           for _ in range(args.chunks)]
            self.dev_out = [torch.empty(n, dtype=torch.uint8, device=dev)
                            for _ in range(args.chunks)]
        self.a = torch.randn(args.size, args.size, device=dev)
        self.small_in = torch.zeros(2**14, device=dev)  # 64 KiB, for --d2d
        self.small_out = torch.empty_like(self.small_in)
        self.c = torch.empty_like(self.a)

    def body(self, matmuls: bool, up: bool, down: bool) -> None:
        """Each chunk's copies fork at a group of matmuls and join after it (the executor's
        pattern for asynchronous moves)."""
        per = max(self.args.matmuls // self.args.chunks, 1)
        for i in range(self.args.chunks):
            fork = torch.cuda.Event()
            fork.record(self.compute)
            joins = [self._copy(stream, dst, src, fork) for on, stream, dst, src in (
                (up, self.h2d, self.dev_in[i], self.host_in[i]),
                (down, self.d2h, self.host_out[i], self.dev_out[i])) if on]
            with torch.cuda.stream(self.compute):
                for _ in range(per if matmuls else 0):
                    torch.mm(self.a, self.a, out=self.c)
                for _ in range(self.args.d2d):
                    self.small_out.copy_(self.small_in)
                for done in joins:
                    self.compute.wait_event(done)

    @staticmethod
    def _copy(stream, dst, src, fork) -> torch.cuda.Event:
        stream.wait_event(fork)
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
        return done

    def timed(self, fn) -> float:
        """Median ms of `fn`, between events on the compute stream."""
        return median_event_ms(fn, self.args.repeats, self.compute)

    def captured(self, flags: tuple[bool, bool, bool]) -> float:
        graph = torch.cuda.CUDAGraph()
        self.compute.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.compute):
            graph.capture_begin()
            self.body(*flags)
            graph.capture_end()

        def replay() -> None:
            with torch.cuda.stream(self.compute):  # where the timing events are recorded
                graph.replay()
        return self.timed(replay)


CASES = {"compute": (True, False, False), "h2d": (False, True, False),
         "d2h": (False, False, True), "h2d+d2h": (False, True, True),
         "compute+h2d": (True, True, False), "compute+d2h": (True, False, True),
         "compute+both": (True, True, True)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    parser.add_argument("--mib", type=int, default=256, help="bytes per direction")
    parser.add_argument("--chunks", type=int, default=8, help="copies per direction")
    parser.add_argument("--matmuls", type=int, default=16, help="matmuls per iteration")
    parser.add_argument("--size", type=int, default=2048, help="of the square matmuls")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--copy-bytes", type=int, default=0,
                        help="bytes per copy (default: --mib split into --chunks)")
    parser.add_argument("--pool", action="store_true",
                        help="each side's buffers in one allocation, as the executor's are")
    parser.add_argument("--host-offset", type=int, default=0,
                        help="with --pool: each host buffer this far past a 4096-byte boundary")
    parser.add_argument("--device-offset", type=int, default=0,
                        help="with --pool: each device buffer this far past a 4096-byte "
                             "boundary")
    parser.add_argument("--d2d", type=int, default=0,
                        help="small device-to-device copies on the compute stream per copy "
                             "(a plan's replay has ~8 per move)")
    parser.add_argument("--name", default="graph_copy_probe", help="of the output file")
    args = parser.parse_args()
    probe = Probe(args)
    rows = {}
    for name, flags in CASES.items():
        eager = probe.timed(lambda flags=flags: probe.body(*flags))
        replayed = probe.captured(flags)
        rows[name] = {"eager_ms": eager, "graph_ms": replayed}
        print(f"{name:14s} eager {eager:8.3f} ms  graph {replayed:8.3f} ms  "
              f"graph/eager {replayed / eager:5.3f}", flush=True)
    gb = (args.copy_bytes * args.chunks if args.copy_bytes else args.mib * 2**20) / 1e9
    for name in ("h2d", "d2h"):
        for mode in ("eager", "graph"):
            rows[name][f"{mode}_gb_per_s"] = gb / (rows[name][f"{mode}_ms"] / 1e3)
    options = {k: v for k, v in vars(args).items() if k not in ("out", "name")}
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, **options,
              "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
