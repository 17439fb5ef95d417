"""Batch scaling: serve a kernel from a profile of the same kernel measured at another batch.

Two kernels *match up to batch* when they have the same op, domain, dtypes, ranks, layout
(`ir.layout`) and structural attributes, and every dimension that differs (in any input or
output, or in a shape-like attribute such as Reshape's target) differs by one common ratio r
(batch and batch*sequence dims both scale by B_target/B_measured). When both batches are known,
r must equal their ratio. Of several matches, the one differing in the fewest dims wins (the
same layer at another batch, not a layer whose spatial size happens to scale by the same ratio),
then the nearest in size. Weight-only kernels (optimizer updates) have no batch dimension: their
signatures match exactly and are never scaled.

The measured time is split into a fixed per-kernel cost and a part that grows with the work:

    t_target = o + (t_measured - o) * W(target) / W(measured),   o = min(launch_s, t_measured)

where W is the roofline work term (max of FLOPs over peak and bytes over bandwidth, see
`costmodel.Roofline.work_s`). So a convolution or GEMM scales with its FLOPs (linear in batch),
a memory-bound kernel with its bytes (sub-linear when weights are a large share of them), and a
kernel that turns compute-bound at the larger batch follows the roofline. Scaled times are
flagged `scaled`, not `estimated`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from autotm_py.profiling.cache import ProfileEntry
from autotm_py.profiling.costmodel import OpShape, Roofline

# Integer-tuple attributes that describe the op itself, never a size: they must match exactly.
STRUCTURAL_ATTRS = frozenset({
    "kernel_shape", "strides", "pads", "dilations", "output_padding", "perm", "axes", "group",
    "auto_pad", "ceil_mode", "count_include_pad", "storage_order", "split_axis", "keep",
    "present",
})


def _scalable(name: str, value: Any) -> bool:
    return (name not in STRUCTURAL_ATTRS and isinstance(value, tuple)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value))


def skeleton(shape: OpShape) -> tuple[Any, ...]:
    """Everything that must be equal for two kernels to match up to batch."""
    attrs = tuple(sorted(
        (k, ("#", len(v)) if _scalable(k, v) else repr(v)) for k, v in shape.attrs.items()))
    ins = tuple((len(s), d) for s, d in shape.inputs)
    outs = tuple((len(s), d) for s, d in shape.outputs)
    return (shape.domain, shape.op, ins, outs, attrs, shape.layout)


def _int_pairs(target: OpShape, source: OpShape) -> Iterable[tuple[int, int]]:
    for (ts, _), (ss, _) in zip(target.inputs + target.outputs, source.inputs + source.outputs,
                                strict=True):
        yield from zip(ts, ss, strict=True)
    for name, value in target.attrs.items():
        if _scalable(name, value):
            yield from zip(value, source.attrs[name], strict=True)


def batch_ratio(target: OpShape, source: OpShape) -> Fraction | None:
    """The common ratio of all differing dims (target / source), or None if there is none."""
    match = _match(target, source)
    return match[0] if match else None


def _match(target: OpShape, source: OpShape) -> tuple[Fraction, int] | None:
    """(common ratio, number of differing dims), or None."""
    ratio: Fraction | None = None
    differing = 0
    for t, s in _int_pairs(target, source):
        if t == s:
            continue
        if t <= 0 or s <= 0:
            return None
        r = Fraction(t, s)
        if ratio is not None and r != ratio:
            return None
        ratio, differing = r, differing + 1
    return (ratio, differing) if ratio is not None else None


@dataclass(frozen=True)
class Scaled:
    """A time derived from a profile at another batch."""

    median_s: float
    p10_s: float
    p90_s: float
    ratio: Fraction
    source_signature: str
    workspace_bytes: int = 0  # the source's workspace scaled (`workspace_ratio`)


def workspace_ratio(batch_ratio: float, bytes_ratio: float) -> float:
    """How a scaled entry's workspace scales: by the batch ratio, or by the operands' bytes
    ratio where that moves further from 1 in the same direction."""
    if batch_ratio < 1:
        return min(batch_ratio, bytes_ratio)
    return max(batch_ratio, bytes_ratio)


def scale_time(t: float, factor: float, launch_s: float) -> float:
    fixed = min(launch_s, t)
    return fixed + (t - fixed) * factor


class BatchIndex:
    """The entries of one profile set for one placement, grouped by `skeleton`."""

    def __init__(self, entries: Mapping[str, Mapping[str, ProfileEntry]]) -> None:
        self._groups: dict[tuple[Any, ...], list[tuple[OpShape, str, str, ProfileEntry]]] = {}
        for sig, by_pl in entries.items():
            shape = OpShape.of_signature(sig)
            for placement, entry in by_pl.items():
                key = (skeleton(shape), placement)
                self._groups.setdefault(key, []).append((shape, sig, placement, entry))

    def find(self, target: OpShape, placement: str, roofline: Roofline,
             batch: int | None = None) -> Scaled | None:
        """The best match of `target`, scaled to it, or None.

        Best: fewest differing dims first (the same layer at another batch differs only in
        its batch dims; a layer whose spatial size happens to scale by the same ratio differs
        in more), then nearest in size.
        """
        best: tuple[tuple[int, float], OpShape, str, ProfileEntry, Fraction] | None = None
        for shape, sig, _, entry in self._groups.get((skeleton(target), placement), ()):
            match = _match(target, shape)
            if match is None:
                continue
            r, differing = match
            if batch and entry.batch and r != Fraction(batch, entry.batch):
                continue
            key = (differing, abs(math.log(r)))
            if best is None or key < best[0]:
                best = (key, shape, sig, entry, r)
        if best is None:
            return None
        _, shape, sig, entry, r = best
        measured_work, target_work = roofline.work_s(shape), roofline.work_s(target)
        # views (no work at either size) cost their fixed part only: unscaled
        factor = target_work / measured_work if measured_work > 0 else (
            float(r) if target_work > 0 else 1.0)
        launch = roofline.launch_s
        # the workspace by the batch ratio r, or by the operands' bytes where they change more
        # than that (every dim scaled by r, a small test layer matched to a large one: r to
        # the rank): a 4x8x16x16 MaxPoolGrad priced from a 32x64x128x128 one got an eighth of
        # its 100 MiB workspace, and its tiny graph no feasible budget (2026-12-04, the H200).
        # The same layer at another batch keeps r (its weights do not scale with the batch).
        ratio = workspace_ratio(float(r), target.bytes / shape.bytes if shape.bytes else 1.0)
        return Scaled(scale_time(entry.median_s, factor, launch),
                      scale_time(entry.p10_s, factor, launch),
                      scale_time(entry.p90_s, factor, launch), r, sig,
                      int((entry.workspace_bytes or 0) * ratio))
