"""Which graph tensor holds which of the module's and the optimizer's values, both ways.

`StateMap.of(graph, captured, module, optimizer)` pairs every weight of the training graph
with the module tensor it comes from (a parameter, or a buffer such as BatchNorm's running
statistics), the optimizer's state tensors with the torch optimizer's per-parameter state,
and names the graph's inputs, labels, learning rate and loss. `master` gives the value a
tensor starts the first iteration from (`Masters`: all of them, each made when the executor
places it); `write_back` puts a run's final values into the module and optimizer.

A graph weight is the module tensor itself, or one the importer derived from it by layout ops
(a Linear exported as `MatMul(X, Transpose(W))` holds W^T: `frontend.weights`); its value
goes through the same ops, and back through their inverse (`WeightSource`: the axes a chain
of transposes permutes, else where each element of the graph weight comes from). A module
tensor must become exactly one graph weight: two (a tied weight read once directly and once
transposed) would train as two.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from autotm_py.errors import ConfigError
from autotm_py.frontend.weights import initializer_values, weight_derivations
from autotm_py.ir.graph import Role, TensorGraph
from autotm_py.kernels.util import in_layout, torch_dtype
from autotm_py.runtime.reference import leaf_value

# How the optimizer state tensors of the training graph are named (ir/training.py): the
# state's kind, then the weight's name; torch's names for the same state
STATE_NAMES = {"m": "exp_avg", "v": "exp_avg_sq", "momentum": "momentum_buffer"}


@dataclass(frozen=True)
class WeightSource:
    """A graph weight's module tensor (its canonical name) and, where the importer derived
    the weight from it, how: `perm`, the axes it transposes (a Linear's W^T: (1, 0)), or
    else `index`, the flat index into the module tensor of each element (row-major)."""

    name: str
    index: np.ndarray | None = None
    perm: tuple[int, ...] | None = None

    def to_graph(self, value: torch.Tensor) -> torch.Tensor:
        """The module tensor's `value` as the graph weight's elements (its shape aside)."""
        if self.perm is not None:
            return value.permute(self.perm)
        if self.index is not None:
            return value.reshape(-1)[torch.from_numpy(self.index)]
        return value

    def to_source(self, value: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """A graph value (row-major, the target's dtype and device) as the module tensor
        `target`: the derivation undone."""
        if self.perm is not None:
            shape = [target.shape[axis] for axis in self.perm]
            inverse = tuple(int(a) for a in np.argsort(self.perm))
            return value.reshape(shape).permute(inverse).reshape(target.shape)
        if self.index is None:
            return value.reshape(target.shape)
        out = torch.empty(target.numel(), dtype=target.dtype, device=target.device)
        out[torch.from_numpy(self.index).to(target.device)] = value.reshape(-1)
        return out.reshape(target.shape)


@dataclass
class StateMap:
    """Graph tensor ids of what the Trainer feeds and reads back."""

    weights: dict[int, WeightSource]  # forward weight id -> its module tensor
    state: dict[int, tuple[int, str]]  # optimizer state id -> (its weight id, torch's key)
    inputs: tuple[int, ...]
    labels: int
    loss: int
    lr: int | None
    step: int | None  # Adam's step counter
    module_tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def of(cls, graph: TensorGraph, captured: Any, module: torch.nn.Module) -> StateMap:
        meta = graph.meta["training"]
        by_name = {t.name: t.id for t in graph.tensors}
        tensors = dict(module.named_parameters(remove_duplicate=False))
        tensors.update(module.named_buffers(remove_duplicate=False))
        weights = weight_sources(captured.model, graph, captured.module_name)
        _check_one_each(weights, captured)
        return cls(weights=weights, state=_state_tensors(graph, weights),
                   inputs=tuple(by_name[name] for name in captured.inputs),
                   labels=int(meta["labels"]), loss=int(meta["loss"]),
                   lr=meta.get("lr_tensor"), step=by_name.get("adam::step"),
                   module_tensors=tensors)

    def master(self, graph: TensorGraph, tid: int, optimizer: Any = None) -> torch.Tensor:
        """The value tensor `tid` (without a producer) starts training from: the module's
        weight or buffer, the optimizer's state where it has any, else as `init_values`
        makes it (zero state, constants)."""
        source = self.weights.get(tid)
        if source is not None:
            value = self.module_tensors[source.name].detach().cpu()
            return as_graph(value, graph.tensors[tid], source)
        state = self.state.get(tid)
        if state is not None and optimizer is not None:
            weight, key = state
            param = self.module_tensors[self.weights[weight].name]
            value = optimizer.state.get(param, {}).get(key)
            if value is not None:
                return as_graph(value.detach().cpu(), graph.tensors[tid], self.weights[weight])
        if tid == self.step and optimizer is not None:
            steps = [s.get("step") for s in optimizer.state.values() if "step" in s]
            if steps:
                return torch.tensor(float(steps[0]), dtype=torch.float32)
        return leaf_value(graph, tid)

    def write_back(self, final: Mapping[int, torch.Tensor], optimizer: Any,
                   shared: frozenset[int] = frozenset()) -> None:
        """Copy the final values of the carried tensors (keyed by their id at the iteration's
        start) into the module's tensors and the optimizer's state. `shared`: weights whose
        module parameter is already their final value's memory (the host's masters:
        `HostSide.shared`); their optimizer state is handed over as it is, not copied (a
        5.85B decoder's moments are 47 GB), and keeps following the Trainer's steps."""
        with torch.no_grad():
            for tid, source in self.weights.items():
                if tid not in shared:
                    target = self.module_tensors[source.name]
                    target.copy_(as_source(final[tid], target, source))
            for tid, (weight, key) in self.state.items():
                param = self.module_tensors[self.weights[weight].name]
                state = optimizer.state[param]
                value = as_source(final[tid], param, self.weights[weight])
                state[key] = value if weight in shared else value.clone()
            if self.step is not None:
                step = final[self.step].detach().to("cpu", torch.float32).reshape(())
                for param in _trained(self):
                    optimizer.state[param]["step"] = step.clone()

    def own_copies(self, optimizer: Any, shared: frozenset[int]) -> None:
        """Give the parameters of weights `shared` (views of the host's masters) and their
        optimizer state memory of their own, contiguous (`Trainer.close`)."""
        with torch.no_grad():
            for tid in shared:
                param = self.module_tensors[self.weights[tid].name]
                param.data = param.data.clone(memory_format=torch.contiguous_format)
                state = optimizer.state.get(param, {})
                for key in STATE_NAMES.values():
                    if isinstance(state.get(key), torch.Tensor):
                        state[key] = state[key].clone(memory_format=torch.contiguous_format)


class LeafValues(MutableMapping[int, torch.Tensor]):
    """The values of a graph's tensors without a producer that an iteration starts from: each
    made when the executor places it (`made`, in a subclass) and not kept, except those given
    (`values[tid] = value`: a batch, the learning rate)."""

    def __init__(self, graph: TensorGraph) -> None:
        self.graph = graph
        self.given: dict[int, torch.Tensor] = {}
        self.leaves = [t.id for t in graph.tensors if t.producer is None]

    def made(self, tid: int) -> torch.Tensor:
        raise NotImplementedError

    def __getitem__(self, tid: int) -> torch.Tensor:
        if tid in self.given:
            return self.given[tid]
        if self.graph.tensors[tid].producer is not None:
            raise KeyError(tid)
        return self.made(tid)

    def __setitem__(self, tid: int, value: torch.Tensor) -> None:
        self.given[tid] = value

    def __delitem__(self, tid: int) -> None:
        del self.given[tid]

    def __iter__(self) -> Iterator[int]:
        return iter(self.leaves)

    def __len__(self) -> int:
        return len(self.leaves)


class Masters(LeafValues):
    """The values a training graph's iteration starts from (`LeafValues`), made from the module
    and the optimizer (`StateMap.master`). Kept, a 3.3B-parameter decoder's weights and AdamW
    state (53 GB) sat in host memory beside the executor's pinned copies of them."""

    def __init__(self, graph: TensorGraph, smap: StateMap, optimizer: Any) -> None:
        super().__init__(graph)
        self.smap, self.optimizer = smap, optimizer

    def made(self, tid: int) -> torch.Tensor:
        return self.smap.master(self.graph, tid, self.optimizer)


def _trained(smap: StateMap) -> list[torch.Tensor]:
    """The module parameters the optimizer state belongs to (once each)."""
    seen: dict[int, torch.Tensor] = {}
    for weight, _ in smap.state.values():
        param = smap.module_tensors[smap.weights[weight].name]
        seen.setdefault(id(param), param)
    return list(seen.values())


def weight_sources(model: Any, graph: TensorGraph, name_of: Callable[[str], str] = str,
                   found: Any = None) -> dict[int, WeightSource]:
    """Every graph weight without a producer that `model` has data for: the tensor it comes
    from (`name_of` an initializer's name: a module's name for it), and for a derived weight
    the axes it transposes or else the index map of its layout ops. `found`:
    `initializer_values(model, graph)`, if read (else `model`, held in memory, has every
    weight's data, and no value is computed: `weight_derivations`)."""
    derivations = weight_derivations(model, graph) if found is None else \
        {tid: found.derived.get(tid) for tid in found.values}
    out: dict[int, WeightSource] = {}
    derived_from: dict[int, str] = {}
    for tid, derived in derivations.items():
        if derived is None:
            out[tid] = WeightSource(name_of(graph.tensors[tid].name))
            continue
        if derived.perm is not None:  # no element map needed: a model's size in int64s
            out[tid] = WeightSource(name_of(derived.initializers[0]), perm=derived.perm)
            continue
        if len(derived.initializers) != 1:
            raise ConfigError(f"weight {graph.tensors[tid].name!r} of the captured graph comes "
                              f"from {len(derived.initializers)} module tensors "
                              f"({', '.join(derived.initializers)}): the Trainer cannot train "
                              "it as one; keep the computation in the forward pass")
        derived_from[tid] = derived.initializers[0]
    maps = _index_maps(model, graph, derived_from)
    for tid, source in derived_from.items():
        out[tid] = WeightSource(name_of(source), maps[tid])
    return {tid: out[tid] for tid in derivations}  # the graph's order


# Indices go through the layout ops as float32 values in two digits of this base (each exact
# in float32's 24-bit mantissa), so tensors of up to 2^40 elements trace exactly.
DIGIT = 1 << 20


def _index_maps(model: Any, graph: TensorGraph, derived_from: Mapping[int, str]
                ) -> dict[int, np.ndarray]:
    """For each element of each derived weight (graph shape, row-major), the flat index of the
    element of its initializer it is: the importer's layout ops applied to the initializers'
    indices (they only move elements, so the indices come through whole). Every weight is
    traced in the same two passes (low and high digits): one pass per weight copied and
    evaluated the whole model each time (GPT-2 small: 127 s of a 202 s Trainer setup)."""
    if not derived_from:
        return {}
    sources = set(derived_from.values())
    flat: dict[str, np.ndarray] = {}
    for init in model.graph.initializer:
        if init.name not in sources:
            continue
        if init.data_type != 1:  # onnx.TensorProto.FLOAT
            tid = next(t for t, s in derived_from.items() if s == init.name)
            raise ConfigError(f"weight {graph.tensors[tid].name!r} is derived from "
                              f"{init.name!r}, which is not float32: the Trainer traces "
                              "layouts of float32 only")
        flat[init.name] = np.arange(int(np.prod(tuple(init.dims))), dtype=np.int64)
    low = _through_layout(model, graph, derived_from, {n: f % DIGIT for n, f in flat.items()})
    high = _through_layout(model, graph, derived_from, {n: f // DIGIT for n, f in flat.items()})
    return {tid: (high[tid].astype(np.int64) * DIGIT + low[tid].astype(np.int64)).reshape(-1)
            for tid in derived_from}


def _through_layout(model: Any, graph: TensorGraph, derived_from: Mapping[int, str],
                    values: Mapping[str, np.ndarray]) -> dict[int, np.ndarray]:
    """The derived weights as the importer derives them when each initializer named in
    `values` holds those values."""
    import onnx
    from onnx import numpy_helper

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for init in probe.graph.initializer:
        if init.name in values:
            shaped = values[init.name].astype(np.float32).reshape(tuple(init.dims))
            init.CopyFrom(numpy_helper.from_array(shaped, init.name))
    found = initializer_values(probe, graph).values
    out: dict[int, np.ndarray] = {}
    for tid, source in derived_from.items():
        if found.get(tid) is None:
            raise ConfigError(f"weight {graph.tensors[tid].name!r}: cannot trace its elements "
                              f"back to {source!r}")
        out[tid] = found[tid]
    return out


def _check_one_each(weights: Mapping[int, WeightSource], captured: Any) -> None:
    """Each module tensor feeds one graph weight (else its copies would train apart), and
    every trainable parameter the forward reads is one."""
    seen: dict[str, int] = {}
    for tid, source in weights.items():
        if source.name in seen:
            raise ConfigError(f"module tensor {source.name!r} became two weights of the "
                              "captured graph (read directly and through a layout op, or "
                              "twice transposed): the Trainer would train them apart")
        seen[source.name] = tid
    missing = sorted({captured.module_name(n) for n in captured.trainable} - set(seen))
    if missing:
        raise ConfigError(f"parameters {', '.join(missing)} are read by the forward pass but "
                          "are no weight of the captured graph")


def _state_tensors(graph: TensorGraph, weights: Mapping[int, WeightSource]
                   ) -> dict[int, tuple[int, str]]:
    """Optimizer state id -> (weight id, torch's state key), from the state's name
    (`<kind>::<weight name>`, ir/training.py)."""
    by_name = {graph.tensors[tid].name: tid for tid in weights}
    out: dict[int, tuple[int, str]] = {}
    for t in graph.tensors:
        if t.role is not Role.OPTIMIZER_STATE or t.producer is not None:
            continue
        prefix, _, rest = t.name.partition("::")
        kind, _, weight = rest.partition("::") if prefix in ("adam", "sgd") else ("", "", "")
        if kind in STATE_NAMES and weight in by_name:
            out[t.id] = (by_name[weight], STATE_NAMES[kind])
    return out


def as_graph(value: torch.Tensor, tensor: Any, source: WeightSource) -> torch.Tensor:
    """A module value as the graph tensor's master: derived as `source` says, the graph's
    dtype, its storage layout."""
    value = source.to_graph(value.to(torch_dtype(tensor.dtype)))
    return in_layout(value.reshape(tensor.shape).contiguous(), tensor)


def as_source(value: torch.Tensor, target: torch.Tensor, source: WeightSource
              ) -> torch.Tensor:
    """A graph value in the module tensor's shape, dtype and device (row-major, undoing the
    derivation `source` holds)."""
    flat = value.detach().contiguous().reshape(-1).to(target.device, target.dtype)
    return source.to_source(flat, target)
