"""The model zoo: AutoTM's workloads plus BERT-base and GPT-2 small, built as ONNX by our code.

Every model is an opset-17 ONNX graph with symbolic input dims ("batch", and "seq" for sequence
models), so one file serves every size; the default bindings (the paper's batch size) are in
the model's metadata under `autotm.default_dims`. Weights are external data that is written
only on request, so the files are small. See docs/zoo.md for each model's definition, sources,
parameter counts and default dims.

    build_model("resnet50", batch=32)              -> onnx.ModelProto
    export_model("resnet50", "models/resnet50.onnx")  -> Path (weights not written)
    build_graph("resnet50", batch=32)              -> TensorGraph (through the ONNX importer)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from autotm_py.errors import ConfigError
from autotm_py.fileio import atomic_write_bytes
from autotm_py.frontend.onnx import import_model
from autotm_py.frontend.zoo.catalog import ENTRIES, ZooEntry
from autotm_py.frontend.zoo.layers import DEFAULT_DIMS_KEY, INDEX_RANGES_KEY
from autotm_py.frontend.zoo.weights import count_params, set_weights_location, write_weights

if TYPE_CHECKING:
    from autotm_py.ir.graph import TensorGraph

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_DIMS_KEY", "INDEX_RANGES_KEY", "ZOO", "ZooEntry", "build_graph",
           "build_model", "count_params", "export_model", "get_entry", "resolve_dims"]


ZOO: dict[str, ZooEntry] = {entry.name: entry for entry in ENTRIES}


def get_entry(name: str) -> ZooEntry:
    if name not in ZOO:
        raise ConfigError(f"unknown zoo model {name!r}; the zoo has: {', '.join(ZOO)}")
    return ZOO[name]


def _positive(option: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or value <= 0):
        raise ConfigError(f"{option} {value}: must be a positive integer")


def resolve_dims(name: str, *, batch: int | None = None,
                 seq_len: int | None = None) -> dict[str, int]:
    """The entry's default dims with `batch` / `seq_len` applied; bad values are errors."""
    entry = get_entry(name)
    _positive("--batch", batch)
    _positive("--seq-len", seq_len)
    dims = dict(entry.default_dims)
    if batch is not None:
        dims["batch"] = batch
    if seq_len is not None:
        if not entry.is_sequence:
            raise ConfigError(f"--seq-len: {name} has no sequence dimension; drop --seq-len")
        if entry.max_seq is not None and seq_len > entry.max_seq:
            raise ConfigError(f"--seq-len {seq_len}: {name} has position embeddings for at most "
                              f"{entry.max_seq} tokens; use --seq-len {entry.max_seq} or less")
        dims["seq"] = seq_len
    return dims


def build_model(name: str, *, batch: int | None = None,
                seq_len: int | None = None) -> onnx.ModelProto:
    """The model as an ONNX ModelProto (weights external, not loaded); dims stay symbolic and
    `batch`/`seq_len` become its default bindings (`autotm.default_dims`)."""
    dims = resolve_dims(name, batch=batch, seq_len=seq_len)
    return get_entry(name).builder(**dims)


def export_model(name: str, path: str | os.PathLike[str], *, batch: int | None = None,
                 seq_len: int | None = None, with_weights: bool = False) -> Path:
    """Write the model to `path` (atomically). Its initializers point at
    `<stem>.weights.bin` beside it, which is written (seeded random values) only if asked."""
    target = Path(path)
    model = build_model(name, batch=batch, seq_len=seq_len)
    location = f"{target.stem}.weights.bin"
    set_weights_location(model, location)
    if with_weights:
        log.info("writing %s parameters of %s to %s", count_params(model, trainable_only=False),
                 name, target.parent / location)
        write_weights(model, target.parent / location)
    atomic_write_bytes(target, model.SerializeToString())
    os.chmod(target, 0o644)  # temp files are created 0600; a model file is meant to be shared
    return target


def build_graph(name: str, *, batch: int | None = None,
                dims: Mapping[str, int] | None = None, fuse: bool = True) -> TensorGraph:
    """The zoo model imported as a forward `TensorGraph` (through the ONNX importer, which
    fuses attention and GELU unless `fuse` is False)."""

    dims = dict(dims or {})
    dims_batch = dims.pop("batch", None)
    batch = dims_batch if batch is None else batch
    model = build_model(name, batch=batch, seq_len=dims.get("seq"))
    return import_model(model, batch=batch, dims=dims or None, name=name, fuse=fuse)
