"""Where a plan's predicted iteration goes: the GPU's kernel time, the gaps in which it waits
(and before which kernel), and how busy each direction of the link is, read from the timeline
`autotm simulate --plan PLAN -o TIMELINE.json` writes.

    autotm optimize models/resnet50.onnx --training --batch 64 --ratio 1:3 --gpu H200 -o p.json
    autotm simulate --plan p.json -o timeline.json
    python experiments/timeline_gaps.py timeline.json [--top 10]

A plan whose link is far from busy while the GPU waits is limited by the order of its copies
and the memory they free, not by the link's bandwidth (experiments/journal/planner-2026-12.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def gpu_spans(timeline: dict[str, Any]) -> list[tuple[float, float, str]]:
    """(start, end, name) of every kernel run and re-run on the GPU's clock, in time order."""
    runs = [(k["start_s"], k["end_s"], k["name"]) for k in timeline["kernels"]]
    runs += [(r["start_s"], r["end_s"], "re-run " + r["name"]) for r in timeline["recomputes"]]
    return sorted(runs)


def waits(spans: list[tuple[float, float, str]], eps: float = 1e-6
          ) -> list[tuple[float, str, float]]:
    """(seconds idle, the kernel it waited for, when it began) of every gap between runs."""
    out, busy_until = [], 0.0
    for start, end, name in spans:
        if start > busy_until + eps:
            out.append((start - busy_until, name, busy_until))
        busy_until = max(busy_until, end)
    return out


def link_busy(timeline: dict[str, Any]) -> dict[str, tuple[float, int]]:
    """Stream -> (seconds of copies, bytes) for each direction of the link."""
    out: dict[str, tuple[float, int]] = {}
    for move in timeline["moves"]:
        seconds, nbytes = out.get(move["stream"], (0.0, 0))
        out[move["stream"]] = (seconds + move["end_s"] - move["start_s"],
                               nbytes + int(move["bytes"]))
    return out


def report(timeline: dict[str, Any], top: int) -> list[str]:
    spans = gpu_spans(timeline)
    gaps = sorted(waits(spans), reverse=True)
    busy = sum(end - start for start, end, _ in spans)
    lines = [f"iteration {timeline['total_s'] * 1e3:.3f} ms (all fast "
             f"{timeline['all_fast_s'] * 1e3:.3f}): kernels {busy * 1e3:.3f} ms, waiting "
             f"{sum(g for g, _, _ in gaps) * 1e3:.3f} ms in {len(gaps)} gaps"]
    for stream, (seconds, nbytes) in sorted(link_busy(timeline).items()):
        lines.append(f"link {stream}: {seconds * 1e3:.3f} ms busy, {nbytes / 2**20:.1f} MiB")
    lines += [f"  {g * 1e3:.3f} ms before {name} at {when * 1e3:.2f} ms"
              for g, name, when in gaps[:top]]
    return lines


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("timeline", type=Path, help="autotm simulate -o's JSON")
    p.add_argument("--top", type=int, default=10, help="the longest gaps to list")
    args = p.parse_args(argv)
    try:
        timeline = json.loads(args.timeline.read_text())
    except (OSError, ValueError) as exc:
        print(f"error: {args.timeline}: {exc} (give the JSON `autotm simulate -o` writes)",
              file=sys.stderr)
        return 2
    print("\n".join(report(timeline, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
