"""Where to cut a training graph's forward kernels into checkpointed segments.

PyTorch activation checkpointing (`torch.utils.checkpoint.checkpoint_sequential`) keeps only the
tensors that cross a segment boundary and recomputes each segment's activations in backward.
A user cuts at block boundaries, where few bytes cross; `forward_segments` does the same for any
imported graph: it aims at `n` segments of equal kernel counts and moves each cut, within a
quarter of a segment, to the point where the fewest activation bytes are live across it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autotm_py.ir.graph import TensorGraph


@dataclass(frozen=True)
class Segment:
    """Forward kernels [start, stop), the tensors they read from outside (`inputs`, in id
    order: earlier activations, inputs, weights) and those read after them (`outputs`)."""

    start: int
    stop: int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


def crossing_bytes(graph: TensorGraph, n_forward: int) -> np.ndarray:
    """bytes[c]: activation bytes produced before forward kernel c and read at or after it
    (c = 1..n_forward-1; the cost of cutting there)."""
    out = np.zeros(n_forward + 1, dtype=np.int64)
    for t in graph.tensors:
        if t.producer is None or t.producer >= n_forward:
            continue
        last = max((u for u in t.users if u < n_forward), default=t.producer)
        # live across every cut c with producer < c <= last
        out[t.producer + 1:last + 1] += t.nbytes
    return out


def cut_points(graph: TensorGraph, n_forward: int, n: int) -> list[int]:
    """The kernel indices where `n` segments start (0 first), at low-crossing points."""
    n = max(1, min(n, n_forward))
    cost = crossing_bytes(graph, n_forward)
    length = n_forward / n
    cuts = [0]
    for i in range(1, n):
        target = round(i * length)
        slack = max(int(length / 4), 0)
        lo, hi = max(cuts[-1] + 1, target - slack), min(n_forward - 1, target + slack)
        if lo > hi:
            continue
        cuts.append(min(range(lo, hi + 1), key=lambda c: (cost[c], abs(c - target))))
    return cuts


def forward_segments(graph: TensorGraph, n_forward: int, n: int,
                     keep: Sequence[int] = ()) -> list[Segment]:
    """`n` segments of the first `n_forward` kernels (see `cut_points`); `keep` are tensors
    wanted after the forward part (the loss), which the last segment returns."""
    cuts = cut_points(graph, n_forward, n)
    bounds = list(zip(cuts, [*cuts[1:], n_forward], strict=True))
    kernels = graph.kernels
    segments = []
    for start, stop in bounds:
        made = {t for k in kernels[start:stop] for t in k.outputs}
        read = {t for k in kernels[start:stop] for t in k.inputs}
        later = {t for k in kernels[stop:n_forward] for t in k.inputs} | set(keep)
        segments.append(Segment(start, stop, tuple(sorted(read - made)),
                                tuple(sorted(made & later))))
    return segments
