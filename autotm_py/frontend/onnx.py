"""ONNX -> forward `TensorGraph`: the public entry points of the importer.

    graph = import_onnx("gpt2.onnx", dims={"seq": 128}, batch=8)
    graph = import_model(model_proto, batch=32, name="resnet50")

Steps (each in its own module): read the file safely (`onnx_load`), parse and check the graph
(`onnx_graph`), bind symbolic input dims (`dims`), fold constant subgraphs interleaved with
ONNX shape inference (`fold`, `infer`, `fold_eval`), canonicalize every remaining node
(`canonical*`), build the graph with tensor roles (`emit`) and fuse attention and GELU
patterns (`fuse`; `fuse=False` keeps the unfused graph). Weights are read as shapes only.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx
import onnx.inliner

from autotm_py.errors import UnsupportedOpError, unsupported_summary
from autotm_py.frontend.canonical import REGISTRY, importable_ops
from autotm_py.frontend.dims import Binding, bind_inputs
from autotm_py.frontend.emit import build_graph
from autotm_py.frontend.fold import Folder
from autotm_py.frontend.fuse import fuse_graph
from autotm_py.frontend.onnx_graph import OnnxGraph, OnnxNode, parse_graph
from autotm_py.frontend.onnx_load import (
    check_external_locations,
    default_opset,
    parse_default_dims,
    read_model_file,
    structure_hash,
)
from autotm_py.frontend.softmax_guard import drop_softmax_guards
from autotm_py.ir.graph import TensorGraph

__all__ = ["import_model", "import_onnx"]

log = logging.getLogger(__name__)

CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def import_onnx(path: str | os.PathLike[str], *, batch: int | None = None,
                dims: Mapping[str, int] | None = None, fuse: bool = True) -> TensorGraph:
    """Import an ONNX file (weights as shapes only) as a forward `TensorGraph`.

    Args:
        path: the .onnx file; external data must live in its folder (it is not read).
        batch: binds the first dimension of every graph input, symbolic or fixed.
        dims: binds symbolic dimensions by name, e.g. {"seq": 128}; they override the
            model's defaults (metadata `autotm.default_dims`).
        fuse: fuse scaled dot-product attention and GELU patterns into one kernel each
            (`frontend/fuse.py`, docs/fusion.md); False keeps the graph as the file has it.

    Raises:
        ModelImportError: unreadable file, malformed graph, unsafe external-data location.
        UnsupportedOpError: an op (or domain) the importer does not support.
        ShapeError: a dimension that stays unknown or inconsistent after binding.
        ConfigError: a `dims` name the model does not have, or a bad value.
    """
    file = Path(path)
    model = read_model_file(file)
    return import_model(model, batch=batch, dims=dims, name=file.stem,
                        base_dir=file.parent, source=str(file), fuse=fuse)


def import_model(model: onnx.ModelProto, *, batch: int | None = None,
                 dims: Mapping[str, int] | None = None, name: str | None = None,
                 base_dir: Path | None = None, source: str | None = None,
                 fuse: bool = True, initializer_weights: bool = False) -> TensorGraph:
    """Import an in-memory `ModelProto` (the zoo builds these) as a forward `TensorGraph`.

    `base_dir` is the folder that external-data locations are relative to (the current
    directory when None). The graph is named `name`, else the ONNX graph's name.
    `initializer_weights`: only what float initializers make is a weight (trained); a
    Constant node's value in a weight slot stays a constant (a captured module's zero bias
    for `bias=False`, a LayerNorm's ones without affine parameters). By default such a value
    is a weight too, as in files that store their weights as Constant nodes.
    """
    start = time.perf_counter()
    label = source or name or model.graph.name or "<model>"
    opset = default_opset(model, label)
    missing = check_external_locations(model, base_dir, label)
    if model.functions:
        model = onnx.inliner.inline_local_functions(model)
    graph = parse_graph(model, opset=opset, source=label,
                        name=name or model.graph.name or "model", base_dir=base_dir)
    graph, _ = drop_softmax_guards(graph, model.opset_import)  # before IsNaN is refused
    _check_ops(graph)
    binding = bind_inputs(graph.inputs, source=label, batch=batch, dims=dims,
                          defaults=parse_default_dims(model, label))
    hint = _rebatch_hint(binding, batch)
    folder = Folder(graph, binding.shapes, model, hint=hint)
    fold = folder.run()
    meta = _meta(model, graph, binding, batch, source, fold.rounds)
    if base_dir is not None:  # a file: its weights' external data, which nothing here reads
        meta["missing_external_data"] = missing
    result = build_graph(graph, fold, folder.value_of, meta, hint,
                         slot_weights=not initializer_weights)
    if fuse:
        result = fuse_graph(result)
    log.info("imported %s: %d ONNX nodes -> %d kernels, %d tensors in %.2f s (%d inference "
             "rounds)", label, len(graph.nodes), len(result.kernels), len(result.tensors),
             time.perf_counter() - start, fold.rounds)
    return result


def _check_ops(graph: OnnxGraph) -> None:
    """Reject, before shape inference sees them, ops of other domains, control flow, and
    ops without a canonical form that cannot be constant (they would have to run as kernels).
    A tensor may be constant when it derives only from initializers, Constant nodes and
    Shape/Size; graph inputs never are."""
    maybe_static = set(graph.initializers)
    bad: list[OnnxNode] = []
    for node in graph.nodes:
        if node.domain != "" or node.op_type in CONTROL_FLOW or \
                not onnx.defs.has(node.op_type, node.domain):
            bad.append(node)
            continue
        static = node.op_type in ("Shape", "Size") or \
            all(i in maybe_static for i in node.inputs if i)
        if static:
            maybe_static.update(node.outputs)
        elif node.op_type not in REGISTRY:
            bad.append(node)
    if bad:
        _unsupported(graph, bad)


def _unsupported(graph: OnnxGraph, nodes: list[OnnxNode]) -> None:
    """One error that names every unsupported op of the model, with its node count."""
    first = nodes[0]
    others = unsupported_summary([(n.op_type, n.domain, n.label) for n in nodes])
    raise UnsupportedOpError(first.op_type, domain=first.domain, opset=graph.opset,
                             node=first.label, supported=importable_ops(), others=others)


def _rebatch_hint(binding: Binding, batch: int | None) -> str:
    if not binding.rebatched:
        return ""
    return (f" (--batch {batch} replaced the fixed first dimension of input "
            f"'{binding.rebatched[0]}'; the graph probably hard-codes the exported batch size: "
            "re-export it with a dynamic batch axis, or drop --batch)")


def _meta(model: onnx.ModelProto, graph: OnnxGraph, binding: Binding, batch: int | None,
          source: str | None, rounds: int) -> dict[str, Any]:
    producer = " ".join(p for p in (model.producer_name, model.producer_version) if p)
    return {
        "source": source,
        "format": "onnx",
        "opset": graph.opset,
        "ir_version": model.ir_version,
        "producer": producer,
        "onnx_graph": model.graph.name,
        "onnx_hash": structure_hash(model),
        "onnx_nodes": len(graph.nodes),
        "dims": dict(binding.dims),
        "batch": batch,
        "input_shapes": {k: list(v) for k, v in binding.shapes.items()},
        "inference_rounds": rounds,
    }

