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


class Probe:
    """Buffers and streams of the miniature iteration."""

    def __init__(self, args: argparse.Namespace) -> None:
        dev = torch.device("cuda")
        self.args = args
        self.compute = torch.cuda.Stream()
        self.h2d, self.d2h = torch.cuda.Stream(), torch.cuda.Stream()
        n = args.mib * 2**20 // args.chunks
        pinned = [torch.empty(n, dtype=torch.uint8, pin_memory=True)
                  for _ in range(2 * args.chunks)]
        self.host_in, self.host_out = pinned[:args.chunks], pinned[args.chunks:]
        self.dev_in = [torch.empty(n, dtype=torch.uint8, device=dev) for _ in range(args.chunks)]
        self.dev_out = [torch.empty(n, dtype=torch.uint8, device=dev)
                        for _ in range(args.chunks)]
        self.a = torch.randn(args.size, args.size, device=dev)
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
    args = parser.parse_args()
    probe = Probe(args)
    rows = {}
    for name, flags in CASES.items():
        eager = probe.timed(lambda flags=flags: probe.body(*flags))
        replayed = probe.captured(flags)
        rows[name] = {"eager_ms": eager, "graph_ms": replayed}
        print(f"{name:14s} eager {eager:8.3f} ms  graph {replayed:8.3f} ms  "
              f"graph/eager {replayed / eager:5.3f}", flush=True)
    gb = args.mib * 2**20 / 1e9
    for name in ("h2d", "d2h"):
        for mode in ("eager", "graph"):
            rows[name][f"{mode}_gb_per_s"] = gb / (rows[name][f"{mode}_ms"] / 1e3)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "mib_per_direction": args.mib, "chunks": args.chunks, "matmuls": args.matmuls,
              "size": args.size, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "graph_copy_probe.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
