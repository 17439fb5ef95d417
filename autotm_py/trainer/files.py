"""Training an ONNX file's own weights on arrays, and writing them back (`autotm train`).

    result = train_file("model.onnx", "data.npz", steps=100, optimizer=Optimizer("sgd", 0.01),
                        config=PlanConfig(ratio="1:3"), output="trained.onnx")

The data file is NumPy's `.npz`: one array per model input, under the input's name, and the
labels under `labels`, all with the samples on their first axis. Batches are taken in order,
the batch size the model's (its first input's first dimension, `--batch` to bind it), the
last partial batch dropped, and the arrays gone through again from the start when `steps`
needs more. The model starts from its own initializers (random values, said once, where the
file has none); the learning rate is an input of the graph (`Optimizer.lr_input`). The
trained weights replace the initializers in a copy of the file (weights the importer derived
by layout ops go back through their inverse), written atomically.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from autotm_py import pipeline
from autotm_py.config import PlanConfig
from autotm_py.errors import ConfigError
from autotm_py.fileio import atomic_write_bytes
from autotm_py.frontend.onnx import import_onnx
from autotm_py.frontend.weights import initializer_values
from autotm_py.ir.graph import Role, TensorGraph
from autotm_py.ir.optim import Optimizer
from autotm_py.ir.precision import with_precision
from autotm_py.ir.training import derive_training
from autotm_py.kernels.util import in_layout, torch_dtype
from autotm_py.options import AUTO_PRECISION, RunMode
from autotm_py.runtime.reference import init_values
from autotm_py.trainer.loop import Loop, default_mode, gpu_name, plan_for, precision_on
from autotm_py.trainer.state import as_source, weight_sources

LABELS = "labels"


@dataclass(frozen=True)
class FileTraining:
    """What `train_file` did: the loss of every step, where the trained model went, notes."""

    losses: tuple[float, ...]
    output: Path
    batch: int
    notes: tuple[str, ...] = ()
    moves: int = 0
    recomputes: int = 0
    precision: str = "fp32"  # the precision it trained in (`--precision`, auto resolved)


def train_file(model: str | os.PathLike[str], data: str | os.PathLike[str], *, steps: int,
               optimizer: Optimizer, config: PlanConfig, output: str | os.PathLike[str],
               loss: str = "auto", batch: int | None = None,
               dims: Mapping[str, int] | None = None, device: str = "cpu",
               mode: RunMode | None = None, seed: int = 0,
               plans_dir: str | os.PathLike[str] | None = None,
               precision: str = AUTO_PRECISION) -> FileTraining:
    """Train the weights of ONNX file `model` for `steps` steps on the arrays of `data` under
    `config`'s budget, and write the trained model to `output`. `precision`: fp32, bf16
    (autocast's, fp32 weights: docs/precision.md) or auto (the device's)."""
    if steps < 1:
        raise ConfigError(f"--steps {steps}: at least 1")
    precision = precision_on(precision, device)
    arrays = read_arrays(data)
    forward = with_precision(import_onnx(model, batch=batch, dims=dims), precision)
    graph = derive_training(forward, optimizer=replace(optimizer, lr_input=True), loss=loss)
    feeds = _feeds(graph, forward, arrays, data)
    found = initializer_values(model, graph)
    masters, notes = _masters(graph, found, seed)
    cuda = device.startswith("cuda")
    mode = mode or default_mode(device)
    notes += pipeline.prepare_cuda(device, mode, None)  # before this process first uses CUDA
    config = replace(config, device="cuda", run=mode, gpu=config.gpu or gpu_name(device),
                     reserve_bytes=config.reserve_bytes if cuda else 0)
    graph, plan = plan_for(graph, config, device, plans_dir=plans_dir, measure=cuda)
    loop = Loop(graph, plan, device, mode, masters)
    losses = _train(loop, graph, feeds, steps, optimizer.lr)
    sources = weight_sources(model, graph, found=found)
    _write(model, loop.finals(), sources, graph, output)
    return FileTraining(tuple(losses), Path(output), feeds.batch, tuple(notes + loop.notes),
                        sum(1 for _ in plan.moves()), sum(1 for _ in plan.recomputes()),
                        precision)


def read_arrays(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The arrays of an `.npz` file, or a `ConfigError` naming it."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--data {path}: not a readable .npz file ({exc}); write one with "
                          "numpy.savez(path, **{input_name: x, 'labels': y})") from None


@dataclass(frozen=True)
class _Feeds:
    """The graph tensors a batch fills, the arrays they come from, and the batch size."""

    tensors: tuple[int, ...]
    arrays: tuple[np.ndarray, ...]
    batch: int

    def batch_at(self, step: int) -> list[torch.Tensor]:
        count = len(self.arrays[0]) // self.batch
        start = (step % count) * self.batch
        return [torch.from_numpy(np.ascontiguousarray(a[start:start + self.batch]))
                for a in self.arrays]


def _feeds(graph: TensorGraph, forward: TensorGraph, arrays: Mapping[str, np.ndarray],
           data: Any) -> _Feeds:
    """Match the model's inputs and the loss's labels with the data file's arrays."""
    names = [forward.tensors[t].name for t in forward.inputs]
    missing = [n for n in (*names, LABELS) if n not in arrays]
    if missing:
        raise ConfigError(f"--data {data}: no array named {', '.join(map(repr, missing))} "
                          f"(it has {', '.join(sorted(arrays)) or 'none'}); give one per model "
                          f"input ({', '.join(names)}) and the labels under '{LABELS}'")
    by_name = {t.name: t.id for t in graph.tensors}
    ids = [*(by_name[n] for n in names), graph.meta["training"]["labels"]]
    chosen = [arrays[n] for n in (*names, LABELS)]
    batch = graph.tensors[ids[0]].shape[0] if graph.tensors[ids[0]].shape else 0
    for tid, array in zip(ids, chosen, strict=True):
        t = graph.tensors[tid]
        if tuple(array.shape[1:]) != t.shape[1:] or array.dtype.name != t.dtype:
            raise ConfigError(f"--data {data}: array for {t.name!r} is {array.dtype.name} "
                              f"{tuple(array.shape)}; the model reads {t.dtype} "
                              f"(samples, {', '.join(map(str, t.shape[1:]))})")
    if len({len(a) for a in chosen}) != 1 or len(chosen[0]) < batch:
        raise ConfigError(f"--data {data}: the arrays must hold the same number of samples, "
                          f"at least one batch ({batch})")
    return _Feeds(tuple(ids), tuple(chosen), batch)


def _masters(graph: TensorGraph, found: Any, seed: int) -> tuple[dict[int, torch.Tensor],
                                                               list[str]]:
    """Every tensor's starting value: the file's weights, seeded random values elsewhere."""
    masters = init_values(graph, seed=seed)
    for tid, value in found.values.items():
        t = graph.tensors[tid]
        masters[tid] = in_layout(torch.from_numpy(value).to(torch_dtype(t.dtype)), t)
    notes = [f"{len(found.missing)} weights have no data in the file (external data "
             f"missing): seeded random values (seed {seed})"] if found.missing else []
    return masters, notes


def _train(loop: Loop, graph: TensorGraph, feeds: _Feeds, steps: int, lr: float
           ) -> list[float]:
    lr_id = graph.meta["training"]["lr_tensor"]
    loss_id = graph.meta["training"]["loss"]
    losses = []
    for step in range(steps):
        values = dict(zip(feeds.tensors, feeds.batch_at(step), strict=True))
        values[lr_id] = torch.tensor(lr, dtype=torch.float32)
        loop.step(values)
        losses.append(float(loop.value(loss_id)))
    return losses


def _write(model: str | os.PathLike[str], finals: Mapping[int, torch.Tensor],
           sources: Mapping[int, Any], graph: TensorGraph, output: str | os.PathLike[str]
           ) -> None:
    """A copy of the file with every trained weight's initializer replaced."""
    import onnx
    from onnx import numpy_helper

    proto = onnx.load(str(model))  # with its external data
    inits = {init.name: init for init in proto.graph.initializer}
    for tid, source in sources.items():
        if tid not in finals or graph.tensors[tid].role is not Role.WEIGHT:
            continue
        init = inits[source.name]
        current = torch.from_numpy(numpy_helper.to_array(init).copy())
        value = as_source(finals[tid].cpu(), current, source)
        init.CopyFrom(numpy_helper.from_array(value.numpy(), init.name))
    atomic_write_bytes(output, proto.SerializeToString())
