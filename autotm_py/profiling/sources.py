"""From profile sets to `KernelCosts`: exact entries, batch-scaled entries, roofline estimates.

The sets of the wanted device kind are ranked by how close their fingerprint is to the wanted
one (`fingerprint.closeness`; user measurements before shipped ones on ties, then the larger
set). Each kernel takes, from the first set that can serve it, the exact entry of its signature
and all-fast placement, else the sum of its parts' entries where it fuses kernels that set
measured (`kernel_parts`: ConvGrad is ConvGradData then ConvGradFilter), else a batch-scaled
entry of that set; a kernel no set serves gets the roofline estimate of the best-ranked set's
device, flagged `estimated`. Parts and batch-scaled entries are flagged `scaled`.

A bf16 kernel (`--precision bf16`) that a set has no bf16 entry for, but whose fp32 form (the
same op, shapes, attributes and layout, every bfloat16 slot float32) it has, exact, as its
parts or batch-scaled (the fp32 kernel's order), is priced from that entry times the
roofline's ratio of the two kernels' work (`Roofline.work_s`: the bf16/fp32 peak ratio where
compute-bound, the bytes ratio where memory-bound; the launch cost kept; its workspace scaled
by the bytes ratio), before any other set is asked. These are counted
(`summary["precision_scaled"]`) and a plan priced so says so (`KernelCosts.precision_note`).
Casts have no fp32 form (roofline estimates).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autotm_py.costs import KernelCosts
from autotm_py.ir.conv_split import CONV_GRAD_PARTS
from autotm_py.ir.graph import kernel_signature
from autotm_py.ir.layout import CHANNELS_LAST, labelled_signature, signature_layout
from autotm_py.ir.rules.fused import CONV_RELU
from autotm_py.profiling.cache import ESTIMATED, ProfileEntry, ProfileSet
from autotm_py.profiling.costmodel import CPU_REFERENCE, H100_SXM, OpShape, Roofline
from autotm_py.profiling.fingerprint import Fingerprint, closeness
from autotm_py.profiling.scaling import BatchIndex, Scaled, scale_time

if TYPE_CHECKING:
    from autotm_py.ir.graph import Kernel, TensorGraph

log = logging.getLogger(__name__)

EXACT, SCALED, ROOFLINE = "measured", "scaled", "estimated"
FROM_FP32 = "fp32-scaled"  # a bf16 kernel priced from its fp32 form's entry
LOW, HIGH = "bfloat16", "float32"
CASTS = frozenset({"Cast", "CastGrad"})  # no fp32 form: a cast to bf16 is bf16's own


def all_fast(kernel: Kernel) -> str:
    """The IO placement with every input and output in fast memory."""
    return "F" * len(kernel.io)


def in_context_placement(graph: TensorGraph, kernel: Kernel) -> str:
    """The placement key of a kernel's in-context entry, "<placement>@<model hash>": its time
    inside whole iterations of that graph (profiling/in_context.py)."""
    return f"{all_fast(kernel)}@{graph.model_hash}"


def graph_batch(graph: TensorGraph) -> int | None:
    """The batch a graph was built at: `meta['batch']`, else `meta['dims']['batch']` (the
    importer's bindings), else dim 0 of its first input."""
    dims = graph.meta.get("dims")
    for batch in (graph.meta.get("batch"), dims.get("batch") if isinstance(dims, dict) else None):
        if isinstance(batch, int) and batch > 0:
            return batch
    if graph.inputs and graph.tensors[graph.inputs[0]].shape:
        return int(graph.tensors[graph.inputs[0]].shape[0])
    return None


def reference_roofline(kind: str) -> Roofline:
    return H100_SXM if kind == "cuda" else CPU_REFERENCE


@dataclass(frozen=True)
class KernelTime:
    median_s: float
    p10_s: float
    p90_s: float
    how: str  # EXACT, SCALED or ROOFLINE
    set_index: int  # rank of the serving set, -1 for the roofline
    workspace_bytes: int = 0
    device_s: float | None = None  # GPU busy time without launch gaps (CUDA entries)
    # served by an in-context entry: there a missing device time means the kernel launched
    # nothing of its own; elsewhere (measured alone, scaled, composed) it is unknown
    in_context: bool = False


# Kernels that run what other kernels ran before a fusion of the backward (ConvGrad: one
# convolution_backward for what ConvGradData and ConvGradFilter computed): op -> its parts.
PARTS = CONV_GRAD_PARTS


def kernel_parts(graph: TensorGraph, kernel: Kernel) -> tuple[tuple[str, str], ...]:
    """(signature, placement) of the kernels whose work `kernel` does in one call, as the
    training derivation emits them where only one gradient is needed (`ir/rules/nn.py`): for
    ConvGrad (dY, X, W -> dX, dW[, dB]), ConvGradData (dY, W -> dX), ConvGradFilter
    (dY, X -> dW) and, with a bias, ConvGradBias (dY -> dB); for the fusion pass's ConvRelu,
    the Conv and the Relu it replaced. Empty for other kernels."""
    if kernel.op_type == CONV_RELU and kernel.domain == "autotm":
        return _conv_relu_parts(graph, kernel)
    if kernel.op_type not in PARTS or kernel.domain != "autotm":
        return ()
    data_op, filter_op = PARTS[kernel.op_type]
    attrs = {k: v for k, v in kernel.attrs if k != "output_mask"}
    spec = [(graph.tensors[t].shape, graph.tensors[t].dtype) for t in kernel.io]
    dy, x, w, dx, dw = spec[:5]

    def sig(op: str, inputs: list, output: tuple, **extra: object) -> tuple[str, str]:
        merged = tuple(sorted({**attrs, **extra}.items()))
        return kernel_signature(op, kernel.domain, merged, inputs, [output]), "FFF"

    parts = [sig(data_op, [dy, w], dx, shape=dx[0]), sig(filter_op, [dy, x], dw, shape=dw[0])]
    if len(spec) > 5:  # the bias gradient
        db = spec[5]
        parts.append((kernel_signature("ConvGradBias", kernel.domain, (("shape", db[0]),),
                                       [dy], [db]), "FF"))
    return tuple(parts)


def _conv_relu_parts(graph: TensorGraph, kernel: Kernel) -> tuple[tuple[str, str], ...]:
    """The unfused pair's entries, Conv (X, W[, B] -> Z) then Relu (Z -> Y), in the kernel's
    layout: a profile measured before the fusion prices ConvRelu at their sum, which is
    what the pair cost (the fused call is faster: its own entry, once profiled, wins)."""
    spec = [(graph.tensors[t].shape, graph.tensors[t].dtype) for t in kernel.io]
    ins, out = spec[:-1], spec[-1]
    layout = signature_layout(kernel.signature)

    def sig(op: str, attrs: tuple, inputs: list, outputs: list) -> str:
        s = kernel_signature(op, "", attrs, inputs, outputs)
        return labelled_signature(s) if layout == CHANNELS_LAST else s

    return ((sig("Conv", kernel.attrs, ins, [out]), "F" * len(kernel.io)),
            (sig("Relu", (), [out], [out]), "FF"))


def _composed(s: ProfileSet, parts: Sequence[tuple[str, str]], rank: int) -> KernelTime | None:
    """A fused kernel's time from measured entries of all its parts in one set: the sum of
    their times, the largest of their workspaces (they run one after another, each freeing
    its own). Marked scaled: derived from measurements, not measured itself."""
    if not parts:
        return None
    entries = [s.get(signature, placement) for signature, placement in parts]
    if any(e is None or e.source == ESTIMATED for e in entries):
        return None
    found = [e for e in entries if e is not None]
    device = [e.device_s for e in found]
    return KernelTime(sum(e.median_s for e in found), sum(e.p10_s for e in found),
                      sum(e.p90_s for e in found), SCALED, rank,
                      max(e.workspace_bytes or 0 for e in found),
                      sum(d for d in device if d) if all(device) else None)


def fp32_signature(signature: str) -> str | None:
    """The signature of the same kernel in fp32 (every bfloat16 slot float32, in the same
    JSON as `ir.graph.kernel_signature`), or None for a kernel without a bfloat16 slot and for
    casts (whose fp32 form is no kernel of an fp32 graph)."""
    body = json.loads(signature)
    op = str(body["op"]).rpartition("::")[2]
    slots = [d for _, d in body["in"] + body["out"]]
    if LOW not in slots or op in CASTS:
        return None
    # a kernel told to write bf16 (`to`: the loss gradient of bf16 logits, which reads fp32
    # log-probabilities) writes fp32 in its fp32 form untold
    body["attrs"] = [[k, v] for k, v in body["attrs"] if not (k == "to" and v == LOW)]
    if any(v == LOW for _, v in body["attrs"]):
        return None
    for side in ("in", "out"):
        body[side] = [[shape, HIGH if d == LOW else d] for shape, d in body[side]]
    return json.dumps(body, separators=(",", ":"), sort_keys=True, default=str)


def _device_time(t: KernelTime) -> float:
    """A kernel's GPU time where some kernels of the graph have one: its in-context device
    time; 0 where an in-context profile saw it launch nothing (`KernelCosts.replayed` prices
    its bytes) or for a roofline estimate (priced at its estimate); else, where no in-context
    profile measured it (a graph whose other kernels did: a new kernel profiled in another
    graph, another device's set) and none measured alone gave one (entries before
    2026-12-03), its time measured alone, launch gap included. Without
    that last rule such a kernel counted as launching nothing: a BERT-base graph whose two
    loss kernels came from an in-context profile had its 639 others priced near zero."""
    if t.device_s is not None:
        return t.device_s
    return 0.0 if t.in_context or t.how == ROOFLINE else t.median_s


class CostSources:
    """Ranked profile sets of one device kind, and the lookup rules above."""

    def __init__(self, kind: str, target: Fingerprint, sets: Sequence[ProfileSet]) -> None:
        self.kind = kind
        self.target = target
        self.sets = sorted(sets, key=lambda s: (closeness(s.fingerprint, target),
                                                not s.shipped, len(s)), reverse=True)
        self._indexes: dict[int, BatchIndex] = {}
        # a fingerprint's measured roofline, from whichever of its sets (user or shipped) has it
        self._rooflines: dict[str, Roofline] = {}
        for s in reversed(self.sets):
            if s.roofline:
                self._rooflines[s.fingerprint.id] = Roofline.from_dict(s.roofline)
        best = self.sets[0].fingerprint if self.sets else None
        self.roofline = self.roofline_for(best) or reference_roofline(kind)

    def roofline_for(self, fingerprint: Fingerprint | None) -> Roofline | None:
        """The measured roofline of a fingerprint's device, if any set stores one."""
        return self._rooflines.get(fingerprint.id) if fingerprint is not None else None

    def exact(self, signature: str, placement: str) -> ProfileEntry | None:
        """The entry measured on exactly the target fingerprint, if any."""
        for s in self.sets:
            if s.fingerprint.id == self.target.id:
                entry = s.get(signature, placement)
                if entry is not None and entry.source != ESTIMATED:
                    return entry
        return None

    def _index(self, rank: int) -> BatchIndex:
        if rank not in self._indexes:
            self._indexes[rank] = BatchIndex(self.sets[rank].entries)
        return self._indexes[rank]

    def lookup(self, graph: TensorGraph, kernel: Kernel, batch: int | None) -> KernelTime:
        placement = all_fast(kernel)
        shape: OpShape | None = None
        in_context = in_context_placement(graph, kernel)
        parts = kernel_parts(graph, kernel)
        for rank, s in enumerate(self.sets):
            context_entry = s.get(kernel.signature, in_context)
            entry = context_entry or s.get(kernel.signature, placement)
            if entry is not None and entry.source != ESTIMATED:
                return KernelTime(entry.median_s, entry.p10_s, entry.p90_s, EXACT, rank,
                                  entry.workspace_bytes or 0, entry.device_s,
                                  in_context=context_entry is not None)
            composed = _composed(s, parts, rank)
            if composed is not None:
                return composed
            shape = shape or OpShape.of_kernel(graph, kernel)
            roofline = self.roofline_for(s.fingerprint) or reference_roofline(self.kind)
            hit = self._index(rank).find(shape, placement, roofline, batch)
            if hit is not None:
                return KernelTime(hit.median_s, hit.p10_s, hit.p90_s, SCALED, rank,
                                  hit.workspace_bytes)
            low = self._from_fp32(kernel.signature, shape, placement, rank, roofline, batch,
                                  parts)
            if low is not None:
                return low
        t = self.roofline.time_s(shape or OpShape.of_kernel(graph, kernel))
        return KernelTime(t, t, t, ROOFLINE, -1)

    def _from_fp32(self, signature: str, shape: OpShape, placement: str, rank: int,
                   roofline: Roofline, batch: int | None,
                   parts: Sequence[tuple[str, str]] = ()) -> KernelTime | None:
        """A bf16 kernel's time from set `rank`'s entry of its fp32 form, found as the fp32
        graph finds it (exact, else the sum of its parts' entries, else batch-scaled), scaled
        by `roofline`'s work of the bf16 kernel over the fp32 one; None where the set has none
        of them or the kernel has no fp32 form (`fp32_signature`)."""
        fp32 = fp32_signature(signature)
        if fp32 is None:
            return None
        fp32_shape = OpShape.of_signature(fp32)
        entry = self._fp32_entry(fp32, fp32_shape, placement, rank, roofline, batch, parts)
        if entry is None:
            return None
        measured = roofline.work_s(fp32_shape)
        factor = roofline.work_s(shape) / measured if measured > 0 else 1.0
        times = (scale_time(t, factor, roofline.launch_s)
                 for t in (entry.median_s, entry.p10_s, entry.p90_s))
        # the workspace as the operands: scaled by the bytes ratio (an estimate until measured)
        workspace = int((entry.workspace_bytes or 0) * shape.bytes / max(fp32_shape.bytes, 1))
        return KernelTime(*times, FROM_FP32, rank, workspace)

    def _fp32_entry(self, fp32: str, fp32_shape: OpShape, placement: str, rank: int,
                    roofline: Roofline, batch: int | None, parts: Sequence[tuple[str, str]]
                    ) -> ProfileEntry | KernelTime | Scaled | None:
        """What set `rank` prices the fp32 form of a kernel with, in `lookup`'s order: its
        exact entry, its parts' measured entries summed (`_composed`; the parts' fp32 forms),
        a batch-scaled entry. In that order so that a bf16 kernel and its fp32 twin come from
        the same measurement: ResNet-50's ConvGrad at batch 256 is priced from its parts
        measured at 256 (workspace under 1 MiB); priced from the whole kernel measured at
        batch 32 instead, its workspace scaled by 8 made 52 bf16 kernels up to 624 MiB of
        workspace that the fp32 graph does not have (docs/precision.md)."""
        exact = self.sets[rank].get(fp32, placement)
        if exact is not None and exact.source != ESTIMATED:
            return exact
        twins = [(fp32_signature(sig) or sig, pl) for sig, pl in parts]
        return _composed(self.sets[rank], twins, rank) or \
            self._index(rank).find(fp32_shape, placement, roofline, batch)

    def costs(self, graph: TensorGraph, **summary: object) -> KernelCosts:
        """Every kernel's time (each unique signature looked up once)."""
        batch = graph_batch(graph)
        by_sig: dict[str, KernelTime] = {}
        for k in graph.kernels:
            if k.signature not in by_sig:
                by_sig[k.signature] = self.lookup(graph, k, batch)
        times = [by_sig[k.signature] for k in graph.kernels]
        return self._assemble(graph, times, dict(summary))

    def _assemble(self, graph: TensorGraph, times: list[KernelTime],
                  summary: dict[str, object]) -> KernelCosts:
        how = Counter(t.how for t in times)
        used = Counter(t.set_index for t in times if t.set_index >= 0)
        for rank, n in sorted(used.items()):
            s = self.sets[rank]
            same_device = s.fingerprint.name == self.target.name
            (log.info if same_device else log.warning)(
                "%d kernels of %s from profiles of %s%s (%s)", n, graph.name, s.fingerprint.id,
                "" if same_device else f", the closest to {self.target.name!r}",
                # a shipped file by name: the same line in every checkout
                f"shipped {Path(s.origin).name}" if s.shipped else s.origin)
        if how[ROOFLINE]:
            log.warning("%d kernels of %s have no profile: roofline estimates on %s",
                        how[ROOFLINE], graph.name, self.roofline.name)
        source = "; ".join(f"{s.fingerprint.id} ({s.origin})" for r, s in enumerate(self.sets)
                           if used[r]) or f"roofline {self.roofline.name}"
        borrowed = {self.sets[r].fingerprint.name for r in used
                    if self.sets[r].fingerprint.name != self.target.name}
        summary.update(kernels=len(times), unique=graph.unique_signatures,
                       exact=how[EXACT], scaled=how[SCALED], estimated=how[ROOFLINE],
                       precision_scaled=how[FROM_FP32],
                       borrowed=sum(n for r, n in used.items()
                                    if self.sets[r].fingerprint.name in borrowed),
                       borrowed_from=sorted(borrowed))
        return KernelCosts(
            device=self.kind,
            times_s=tuple(t.median_s for t in times),
            p10_s=tuple(t.p10_s for t in times),
            p90_s=tuple(t.p90_s for t in times),
            estimated=tuple(t.how == ROOFLINE for t in times),
            scaled=tuple(t.how == SCALED for t in times),
            source=source,
            summary=summary,
            workspace_bytes=tuple(t.workspace_bytes for t in times),
            device_s=tuple(_device_time(t) for t in times)
            if any(t.device_s for t in times) else (),
            target=self.target.name,
        )
