"""The fusion pass: standard multi-kernel patterns of an imported forward graph become one
fused kernel each.

    fused = fuse_graph(graph)            # import_onnx/import_model call it unless fuse=False
    fused.meta["fusion"]     # {"attention": 12, "gelu": 13, "linear": 74, "conv_relu": 0,
                             #  "rms_norm": 0, "silu": 0, "rotary": 0}

Patterns (each in its own module; docs/fusion.md has the exact forms):
- scaled dot-product attention (`fuse_attention`): MatMul(Q, K^T) -> scale -> mask ->
  Softmax(last axis) -> MatMul(., V) becomes `ScaledDotProductAttention` (domain "autotm"),
  whose backward saves a logsumexp per query row instead of the probability matrix;
- GELU (`fuse_gelu`): the erf and tanh forms exporters write before opset 20 become ONNX
  `Gelu` (approximate "none" / "tanh"), whose backward saves only its input;
- Linear (`fuse_linear`): MatMul(X, W) with a 2-d W plus the Add of a bias per output
  column, or MatMul(X, Transpose(W)), becomes `Linear` (domain "autotm"): one addmm, and one
  backward kernel for dX, dW and dB;
- convolution + ReLU (`fuse_conv_relu`): a Conv whose output only a Relu reads becomes
  `ConvRelu` (domain "autotm"): on CUDA one cuDNN call with the bias and the ReLU in its
  epilogue;
- RMSNorm (`fuse_rms_norm`): Pow/ReduceMean/Add/Sqrt/Div (or Reciprocal)/Mul and the
  optional weight Mul of Llama-style models become `RMSNormalization` (domain "autotm"),
  whose backward saves X and one rstd per row;
- SiLU (`fuse_silu`): Mul(X, Sigmoid(X)) becomes `Silu` (domain "autotm"), saving only X;
- rotary position embedding (`fuse_rotary`): X * COS + Concat(-X[h:], X[:h]) * SIN
  (transformers' apply_rotary_pos_emb: Slice, Slice, Neg, Concat, Mul, Mul, Add) becomes
  `RotaryEmbedding` (domain "autotm"): three launches forward, one three-launch
  `RotaryEmbeddingGrad` backward;
- then, on the fused graph (`fuse_heads`): attention whose heads are split off before a
  rotary embedding or a repetition of key/value heads (Llama-style decoders) runs with those
  steps in the heads-last layout, without the four head Transposes.

A pattern matches only when the fused op computes the same function (constants checked,
softmax over the last axis, K^T really the transpose of K, intermediate tensors read by
nothing else); anything else is left as it is. A graph without matches keeps its kernels
and tensors (only `meta` gains the counts). Matching sees the original graph; the accepted
rewrites are disjoint and are applied in one rebuild, in which every surviving tensor keeps
its name (ids are renumbered) and the fused kernel runs where the last kernel of its pattern
ran, i.e. where the producer of its output ran, so a pattern may read the output of another
(a Linear after a GELU).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from autotm_py.errors import GraphError
from autotm_py.frontend.fuse_attention import match_attention
from autotm_py.frontend.fuse_base import Matcher, NewKernel, Ref, Rewrite
from autotm_py.frontend.fuse_conv_relu import match_conv_relu
from autotm_py.frontend.fuse_gelu import match_gelu
from autotm_py.frontend.fuse_heads import match_heads_last
from autotm_py.frontend.fuse_linear import match_linear
from autotm_py.frontend.fuse_rms_norm import match_rms_norm
from autotm_py.frontend.fuse_rotary import match_rotary
from autotm_py.frontend.fuse_silu import match_silu
from autotm_py.ir.builder import GraphBuilder
from autotm_py.ir.graph import Kernel, TensorGraph

log = logging.getLogger(__name__)

FUSION_META_KEY = "fusion"
KINDS = ("attention", "gelu", "linear", "conv_relu", "rms_norm", "silu", "rotary", "heads_last")
Matcher_ = Callable[[Matcher, Kernel], Rewrite | None]  # a pattern: a rewrite anchored at a kernel
FIRST_ROUND = (match_attention, match_gelu, match_linear, match_conv_relu, match_rms_norm,
               match_silu, match_rotary)
SECOND_ROUND = (match_heads_last,)  # over the first round's fused kernels


# ---- the pass ---------------------------------------------------------------------------------
def find_rewrites(graph: TensorGraph, matchers: Sequence[Matcher_] = FIRST_ROUND
                  ) -> list[Rewrite]:
    """Every accepted, mutually disjoint rewrite of the graph by `matchers`, in order (the
    first round's: attention, GELU, Linear, convolution + ReLU, RMSNorm, SiLU, then the
    rotary embedding)."""
    m = Matcher(graph)
    accepted: list[Rewrite] = []
    removed: set[int] = set()
    produced: set[int] = set()  # existing tensors that accepted rewrites produce again
    for matcher in matchers:
        for k in graph.kernels:
            rewrite = matcher(m, k)
            if rewrite is not None and _disjoint(graph, rewrite, removed, produced):
                accepted.append(rewrite)
                removed |= rewrite.removed
                produced.update(r for _, nk in rewrite.placed for r in nk.outputs
                                if isinstance(r, int))
    return accepted


def _disjoint(graph: TensorGraph, rewrite: Rewrite, removed: set[int],
              produced: set[int]) -> bool:
    """No kernel removed twice, and every input still exists: its producer is not removed by
    another rewrite, or that rewrite's fused kernel produces it again (where it was made)."""
    if rewrite.removed & removed:
        return False
    for _, nk in rewrite.placed:
        for ref in nk.inputs:
            if isinstance(ref, int) and graph.tensors[ref].producer in removed and \
                    ref not in produced:
                return False
    return True


def fuse_graph(graph: TensorGraph) -> TensorGraph:
    """The graph with every recognized pattern fused; `meta["fusion"]` counts them by kind."""
    if "training" in graph.meta:
        raise GraphError(f"graph {graph.name!r} is a training graph; fuse the forward graph, "
                         "then derive training")
    fused, rewrites = graph, []
    for matchers in (FIRST_ROUND, SECOND_ROUND):
        found = find_rewrites(fused, matchers)
        fused = apply_rewrites(fused, found) if found else fused
        rewrites += found
    counts = {kind: sum(1 for r in rewrites if r.kind == kind) for kind in KINDS}
    if rewrites:
        log.info("fused %s of %s: %d kernels -> %d", ", ".join(f"{n} {k}" for k, n in
                 counts.items()), graph.name, len(graph.kernels), len(fused.kernels))
    return _with_meta(fused, counts)


def _with_meta(graph: TensorGraph, counts: dict[str, int]) -> TensorGraph:
    return replace(graph, meta={**graph.meta, FUSION_META_KEY: counts})


def apply_rewrites(graph: TensorGraph, rewrites: Sequence[Rewrite]) -> TensorGraph:
    """Rebuild the graph without the removed kernels and with the new ones in place."""
    removed = set().union(*(r.removed for r in rewrites))
    placed: dict[int, list[NewKernel]] = {}
    for r in rewrites:
        for pos, nk in r.placed:
            placed.setdefault(pos, []).append(nk)
    out = _Rebuild(graph, GraphBuilder(graph.name))
    out.copy_tensors(removed, [nk for nks in placed.values() for nk in nks])
    for k in graph.kernels:
        for nk in placed.get(k.id, ()):
            out.b.add_kernel(nk.op_type, [out.ref(r) for r in nk.inputs],
                             [out.ref(r) for r in nk.outputs], name=nk.name, domain=nk.domain,
                             attrs=nk.attrs, workspace_bytes=nk.workspace_bytes)
        if k.id not in removed:
            out.b.add_kernel(k.op_type, [out.ids[t] for t in k.inputs],
                             [out.ids[t] for t in k.outputs], name=k.name, domain=k.domain,
                             attrs=k.attrs_dict, workspace_bytes=k.workspace_bytes)
    return out.finish()


@dataclass
class _Rebuild:
    """The new graph's builder and the map from old (and new) tensors to its ids."""

    graph: TensorGraph
    b: GraphBuilder
    ids: dict[int, int] = field(default_factory=dict)
    made: dict[int, int] = field(default_factory=dict)  # id(NewTensor) -> tensor id

    def copy_tensors(self, removed: set[int], new_kernels: list[NewKernel]) -> None:
        """Every old tensor still read or written (or a graph input/output), in id order."""
        g = self.graph
        used = set(g.inputs) | set(g.outputs)
        used.update(t for k in g.kernels if k.id not in removed for t in k.io)
        used.update(r for nk in new_kernels for r in nk.inputs + nk.outputs if isinstance(r, int))
        for t in g.tensors:
            if t.id in used:
                self.ids[t.id] = self.b.add_tensor(t.name, t.shape, t.dtype, t.role)
                if t.id in g.constants:
                    self.b.constants[self.ids[t.id]] = g.constants[t.id]

    def ref(self, ref: Ref) -> int:
        if isinstance(ref, int):
            return self.ids[ref]
        if id(ref) not in self.made:
            tid = self.b.add_tensor(ref.name, ref.shape, ref.dtype, ref.role)
            if ref.value is not None:
                self.b.constants[tid] = ref.value
            self.made[id(ref)] = tid
        return self.made[id(ref)]

    def finish(self) -> TensorGraph:
        g, ids = self.graph, self.ids
        self.b.inputs = [ids[t] for t in g.inputs]
        self.b.outputs = [ids[t] for t in g.outputs]
        self.b.carried = [(ids[a], ids[z]) for a, z in g.carried if a in ids and z in ids]
        self.b.meta = dict(g.meta)
        return self.b.build()
