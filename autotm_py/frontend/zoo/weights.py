"""Parameter counts and the optional weights file of a zoo model.

The zoo's .onnx files reference their weights as external data (`<stem>.weights.bin` beside the
.onnx) that is written only on request. Random values are enough for what autotm does with them
(time kernels, check that a plan runs), but they must keep activations finite through hundreds
of layers, so each weight is drawn with the scale its consumer expects (He-normal for Conv and
Gemm, N(0, 0.02) for MatMul weights and embeddings) and normalization parameters and biases get
their usual constants.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from autotm_py.frontend.zoo.layers import INIT_DOC_PREFIX

# (op_type, input slot) of BatchNormalization's running statistics: not trainable parameters.
_BN_STATS = {("BatchNormalization", 3), ("BatchNormalization", 4)}
# Constant initial values by (op_type, slot); anything not listed and not drawn below is 0.
_CONSTANT_INIT = {("BatchNormalization", 1): 1.0, ("BatchNormalization", 4): 1.0,
                  ("LayerNormalization", 1): 1.0}
_CHUNK = 1 << 24  # values generated at a time, so a 10M-row table needs no GiB of scratch


def _consumers(model: onnx.ModelProto) -> Iterator[tuple[str, int, TensorProto]]:
    """(op_type, slot, initializer) for the first use of each initializer, in node order."""
    inits = {t.name: t for t in model.graph.initializer}
    seen: set[str] = set()
    for node in model.graph.node:
        for slot, name in enumerate(node.input):
            if name in inits and name not in seen:
                seen.add(name)
                yield node.op_type, slot, inits[name]


def count_params(model: onnx.ModelProto, *, trainable_only: bool = True) -> int:
    """Elements of the initializers; without BatchNorm running statistics unless asked.

    This is what papers and torch's `sum(p.numel() for p in model.parameters())` report.
    """
    total = 0
    for op_type, slot, tensor in _consumers(model):
        if trainable_only and (op_type, slot) in _BN_STATS:
            continue
        total += math.prod(tensor.dims)
    return total


def init_scale(op_type: str, slot: int, tensor: TensorProto) -> tuple[float, float]:
    """(mean, std) of a weight's initial values; std 0 means the constant `mean`."""
    if tensor.doc_string.startswith(INIT_DOC_PREFIX):
        return float(tensor.doc_string[len(INIT_DOC_PREFIX):]), 0.0
    dims = tuple(tensor.dims)
    if op_type == "Conv" and slot == 1:
        return 0.0, math.sqrt(2.0 / math.prod(dims[1:]))
    if op_type == "Gemm" and slot == 1:  # (out, in) with transB=1, as the zoo writes it
        return 0.0, math.sqrt(2.0 / dims[-1])
    if (op_type, slot) in (("MatMul", 1), ("Gather", 0)):
        return 0.0, 0.02
    return _CONSTANT_INIT.get((op_type, slot), 0.0), 0.0


def _external(tensor: TensorProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def _write_tensor(fh: object, tensor: TensorProto, mean: float, std: float,
                  rng: np.random.Generator) -> None:
    entries = _external(tensor)
    fh.seek(int(entries.get("offset", 0)))  # type: ignore[attr-defined]
    remaining = math.prod(tensor.dims)
    while remaining:
        n = min(remaining, _CHUNK)
        if std:
            values = rng.standard_normal(n, dtype=np.float32) * np.float32(std)
        else:
            values = np.full(n, mean, dtype=np.float32)
        fh.write(values.tobytes())  # type: ignore[attr-defined]
        remaining -= n


def write_weights(model: onnx.ModelProto, path: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """Write every external initializer of `model` into `path` at its offset (atomically)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            for index, (op_type, slot, tensor) in enumerate(_consumers(model)):
                mean, std = init_scale(op_type, slot, tensor)
                rng = np.random.default_rng([seed, index])
                _write_tensor(fh, tensor, mean, std, rng)
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def set_weights_location(model: onnx.ModelProto, location: str) -> None:
    """Point every external initializer at `location` (relative to the .onnx's folder)."""
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
