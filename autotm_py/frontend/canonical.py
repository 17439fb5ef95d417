"""Per-op canonicalization: one ONNX node (opset 9 and newer) -> kernels of the IR vocabulary.

The canonicalizers live in `canonical_nn` (compute ops), `canonical_shape` (data movement) and
`canonical_rnn` (LSTM, GRU) and register themselves here; `lower` dispatches. The canonical
form is documented in `autotm_py.ir.ops` and docs/import.md.
"""

from __future__ import annotations

from autotm_py.errors import UnsupportedOpError
from autotm_py.frontend import (  # noqa: F401  (registration)
    canonical_nn,
    canonical_rnn,
    canonical_shape,
)
from autotm_py.frontend.canonical_base import REGISTRY, Ctx, KernelSpec, Lowered
from autotm_py.frontend.fold_eval import foldable_ops
from autotm_py.frontend.onnx_graph import OnnxNode
from autotm_py.ir.ops import SUPPORTED_OPS

__all__ = ["IMPORT_ONLY_OPS", "REGISTRY", "KernelSpec", "Lowered", "importable_ops", "lower"]

# ONNX ops that import, but as another op of the vocabulary or as nothing at all.
IMPORT_ONLY_OPS = ("CastLike", "Upsample")


def importable_ops() -> tuple[str, ...]:
    """Ops that may appear as kernels: the vocabulary plus the import-only aliases."""
    return tuple(sorted({*SUPPORTED_OPS, *IMPORT_ONLY_OPS}))


def lower(node: OnnxNode, ctx: Ctx) -> Lowered:
    """The canonical kernels of `node`, or `UnsupportedOpError` naming op, domain and opset."""
    fn = REGISTRY.get(node.op_type) if node.domain == "" else None
    if fn is None:
        what = "the ONNX importer"
        if node.domain == "" and node.op_type in foldable_ops():
            what = "the ONNX importer except on constant inputs (they fold)"
        raise UnsupportedOpError(node.op_type, domain=node.domain, opset=ctx.opset,
                                 node=node.label, supported=importable_ops(), what=what)
    return fn(node, ctx)
