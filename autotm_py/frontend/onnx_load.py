"""Reading an ONNX file safely: existence, emptiness, decoding, opsets, external-data paths.

Weights are never loaded here (`load_external_data=False`): the importer needs only their
shapes. Every failure is a one-line `ModelImportError` that names the file and says what to do.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto

from autotm_py.errors import ModelImportError

log = logging.getLogger(__name__)

MIN_OPSET = 9
MAX_OPSET = onnx.defs.onnx_opset_version()
DEFAULT_DIMS_KEY = "autotm.default_dims"
DEFAULT_DOMAINS = ("", "ai.onnx")


def read_model_file(path: Path) -> onnx.ModelProto:
    """Parse `path` as an ONNX model without its external data; errors name the file."""
    if not path.exists():
        raise ModelImportError(f"model file '{path}' does not exist; check the path, or give "
                               "a zoo model name (see `autotm zoo list`)")
    if not path.is_file():
        raise ModelImportError(f"model path '{path}' is not a file; give the .onnx file itself")
    data = path.read_bytes()
    if not data:
        raise ModelImportError(f"model file '{path}' is empty; re-export the model")
    try:
        model = onnx.load_model_from_string(data)
    except DecodeError:
        raise ModelImportError(f"model file '{path}' is not a readable ONNX model (truncated, or "
                               "not ONNX at all); re-export or re-download it") from None
    if not model.ir_version or not model.HasField("graph"):
        raise ModelImportError(f"model file '{path}' is not an ONNX model (it has no IR version "
                               "or no graph); re-export it with onnx or torch.onnx.export")
    return model


def default_opset(model: onnx.ModelProto, source: str) -> int:
    """The opset of the default ONNX domain; outside 9..newest is an error with the fix."""
    versions = [o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    if not versions:
        raise ModelImportError(f"model '{source}' imports no opset of the default ONNX domain; "
                               "re-export it with a standard opset (9 or newer)")
    opset = max(versions)
    if opset < MIN_OPSET:
        raise ModelImportError(
            f"model '{source}' uses opset {opset}, older than the oldest supported ({MIN_OPSET}); "
            f"convert it with onnx.version_converter.convert_version(model, {MIN_OPSET})")
    if opset > MAX_OPSET:
        raise ModelImportError(
            f"model '{source}' uses opset {opset}, newer than this onnx {onnx.__version__} "
            f"knows ({MAX_OPSET}); upgrade the onnx package or export with opset {MAX_OPSET}")
    return opset


def external_tensors(model: onnx.ModelProto) -> list[TensorProto]:
    """Initializers and Constant-node tensors of the main graph that store data externally."""
    tensors = [t for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR and \
                    attr.t.data_location == TensorProto.EXTERNAL:
                tensors.append(attr.t)
    return tensors


def check_external_locations(model: onnx.ModelProto, base_dir: Path | None,
                             source: str) -> list[str]:
    """Refuse external-data locations that are absolute or escape the model's folder; return
    the locations whose file is missing.

    A missing data file is fine for importing (only shapes are read; `autotm run` says so); a
    location outside the folder is an error so that a crafted model cannot make us read
    (later, at execution) arbitrary files.
    """
    base = (base_dir or Path.cwd()).resolve()
    missing: set[str] = set()
    for tensor in external_tensors(model):
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        if not location:
            raise ModelImportError(f"tensor '{tensor.name}' of model '{source}' is marked as "
                                   "external data but names no location; re-save the model")
        target = (base / location).resolve()
        if os.path.isabs(location) or not target.is_relative_to(base):
            raise ModelImportError(
                f"tensor '{tensor.name}' of model '{source}' stores its data at '{location}', "
                f"outside the model's folder '{base}'; move the data file next to the model "
                "and save the model with a relative location")
        if not target.exists():
            missing.add(location)
    return sorted(missing)


def parse_default_dims(model: onnx.ModelProto, source: str) -> dict[str, int]:
    """Dim bindings the model suggests in metadata `autotm.default_dims` (JSON name -> int)."""
    props = {p.key: p.value for p in model.metadata_props}
    text = props.get(DEFAULT_DIMS_KEY)
    if text is None:
        return {}
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError
        dims = {str(k): int(v) for k, v in raw.items()}
        if any(v <= 0 or not float(raw[k]).is_integer() for k, v in dims.items()):
            raise ValueError
    except (ValueError, TypeError):
        raise ModelImportError(f"model '{source}' has metadata {DEFAULT_DIMS_KEY}={text!r}, "
                               "which is not a JSON object of positive integers; fix or remove "
                               "it") from None
    return dims


def structure_hash(model: onnx.ModelProto) -> str:
    """A hash of the model's structure (nodes, attributes, opsets, inputs, initializer shapes
    and dtypes), not of weight values: the same graph with other weights hashes the same."""
    h = hashlib.sha256()
    for opset in model.opset_import:
        h.update(f"{opset.domain}:{opset.version};".encode())
    for node in model.graph.node:
        h.update(node.SerializeToString())
    for init in model.graph.initializer:
        h.update(f"{init.name}|{init.data_type}|{list(init.dims)};".encode())
    for value in (*model.graph.input, *model.graph.output):
        h.update(value.SerializeToString())
    return h.hexdigest()[:16]
