"""Optimizer updates on the host (`offload_updates`): the GPU's graph without them.

A model whose fp32 master weights and Adam moments do not fit the GPU pays, with its updates
on the GPU, for streaming all of that state in and out every step (12 bytes of state and 4 of
gradient per parameter, each way). With the update on the host, only what the GPU's kernels
read and write crosses the link: the weights in and their gradients out (4 bytes a parameter
each). ZeRO-Offload's and FSDP's CPU offload make that choice for every parameter; here it
is a graph option the planner prices (docs/training-loop.md).

`offload_updates(graph)` takes a training graph (`ir.training.derive_training`) and returns
the graph the GPU runs, with every optimizer update removed, for each trained weight W:

- its update kernel (`SGDUpdate`, `AdamUpdate`; `AdamStep` with the last of them), its
  optimizer state and the next values (W', moments, momentum buffers) are the host's;
- *fed*: W itself, fp32, given (no producer) and starting each iteration in the slow tier,
  where the host updated it in place (`starts_slow`); under bf16 its cast to bf16 stays on
  the GPU;
- *drained*: W's fp32 gradient, a graph output that ends the iteration in the slow tier,
  where the host's optimizer steps on it as it lies (`ends_slow`).

Both stay fp32, though bf16 would halve their bytes on the link: a cast pass on the host over
every weight or gradient took half as long as AdamW itself (`experiments/gpu/cpu_adam_probe.py`
`host_side`, a 2-core machine, 2026-12-05), and where the host's updates are what ends the
step (a 3.33B decoder's 0.66 s of AdamW on the H200's host) the GPU's casts and the link's
bytes are the cheaper side. The record of each update, in the order the GPU makes the
gradients (the host runs them in that order as they arrive), is `graph.meta[META_KEY]`: a
tuple of `HostUpdate`
fields (`offloaded_updates(graph)` reads them back); the optimizer is `meta["training"]`'s.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import astuple, dataclass, replace

from autotm_py.errors import ConfigError
from autotm_py.ir.builder import GraphBuilder
from autotm_py.ir.graph import Kernel, Role, TensorGraph
from autotm_py.options import HOST_SHARE_KEY, HOST_UPDATES_KEY

META_KEY = HOST_UPDATES_KEY
SHARE_KEY = HOST_SHARE_KEY
UPDATE_OPS = frozenset({"SGDUpdate", "AdamUpdate"})
STEP_OP = "AdamStep"


@dataclass(frozen=True)
class HostUpdate:
    """One weight's update on the host, by tensor names of the graphs (ids differ between the
    training graph and the GPU's)."""

    weight: str  # the fp32 weight the GPU reads and the host updates
    grad: str  # its fp32 gradient, which the GPU drains
    numel: int


def offloaded_updates(graph: TensorGraph) -> tuple[HostUpdate, ...]:
    """The updates `offload_updates` moved to the host (() for any other graph)."""
    return tuple(HostUpdate(*fields) for fields in graph.meta.get(META_KEY) or ())


def fed_tensors(graph: TensorGraph) -> frozenset[int]:
    """Ids of the tensors the host writes before each iteration: they start in slow memory."""
    by_name = graph.tensor_ids_by_name
    return frozenset(by_name[u.weight] for u in offloaded_updates(graph))


def drained_tensors(graph: TensorGraph) -> frozenset[int]:
    """Ids of the gradients the host reads after each iteration: they end in slow memory."""
    by_name = graph.tensor_ids_by_name
    return frozenset(by_name[u.grad] for u in offloaded_updates(graph))


def update_bytes(graph: TensorGraph) -> int:
    """Bytes the optimizer updates of a training graph read: the trained weights, their
    gradients and the optimizer state (what updates on the GPU must hold or stream)."""
    return sum(graph.tensors[t].nbytes for k in graph.kernels if k.op_type in UPDATE_OPS
               for t in set(k.inputs) if graph.tensors[t].numel > 1)


def gpu_kept_updates(graph: TensorGraph, host_share: float) -> tuple[str, ...]:
    """The weights whose updates a split keeps on the GPU so that the host updates about
    `host_share` of the parameters: those of the last gradients the GPU makes (graph: the
    all-host `offload_updates` of a training graph), at least one short of all of them.
    Their updates run after the backward pass anyway, and the next iteration's forward reads
    their weights first, so each one kept shortens the host's part where it ends the step."""
    updates = offloaded_updates(graph)
    total = sum(u.numel for u in updates)
    keep: list[str] = []
    gpu = 0
    for u in reversed(updates[1:]):
        if gpu + u.numel / 2 > (1 - host_share) * total:
            break
        keep.append(u.weight)
        gpu += u.numel
    return tuple(keep)


def offload_updates(graph: TensorGraph, host_share: float | None = None) -> TensorGraph:
    """The GPU's part of training graph `graph`: every optimizer update on the host (module
    docstring), or with `host_share` (a split) the host's about that share of the parameters
    and the GPU's the rest, the updates of the last gradients (`gpu_kept_updates`; a share
    that leaves none to the GPU gives every update to the host). A graph without updates is a
    `ConfigError`; a graph already offloaded comes back unchanged. A split graph records its
    share (`meta[SHARE_KEY]`: `options.ModelOptions.of_graph` reads it back)."""
    if offloaded_updates(graph):
        return graph
    hosted = _offload(graph, ())
    if host_share is None:
        return hosted
    if not 0 < host_share < 1:
        raise ConfigError(f"host share {host_share!r}: give the fraction of the parameters the "
                          "host updates, between 0 and 1 (exclusive)")
    keep = gpu_kept_updates(hosted, host_share)
    if not keep:
        return hosted
    split = _offload(graph, frozenset(keep))
    return replace(split, meta={**split.meta, SHARE_KEY: float(host_share)})


def _offload(graph: TensorGraph, keep: Collection[str]) -> TensorGraph:
    """`graph` with the updates of every trained weight not named in `keep` on the host."""
    updates = [k for k in graph.kernels if k.op_type in UPDATE_OPS]
    if not updates:
        raise ConfigError(f"graph {graph.name!r} has no optimizer updates to run on the host: "
                          "derive a training graph first (--training)")
    dropped_kernels: set[int] = set()
    dropped_tensors: set[int] = set()
    records = [_offload_one(graph, k, dropped_kernels, dropped_tensors) for k in updates
               if graph.tensors[k.inputs[0]].name not in keep]
    kept_adam = any(k.op_type == "AdamUpdate" and graph.tensors[k.inputs[0]].name in keep
                    for k in updates)
    for k in graph.kernels:
        if k.op_type == STEP_OP and not kept_adam:  # the GPU's Adam updates read its step
            dropped_kernels.add(k.id)
            dropped_tensors.update(k.inputs)
            dropped_tensors.update(k.outputs)
    dropped_tensors.update(_unused_after(graph, dropped_kernels))
    # the step's coefficients and the learning rate, which every update reads, stay for the
    # GPU's (a split)
    dropped_tensors -= {t for k in graph.kernels if k.id not in dropped_kernels
                        for t in (*k.inputs, *k.outputs)}
    drained = {u.grad for u in records}
    # the host runs the updates as the GPU makes their gradients
    records.sort(key=lambda u: graph.by_name(u.grad).producer)
    return _rebuild(graph, dropped_kernels, dropped_tensors, drained, tuple(records))


def _offload_one(graph: TensorGraph, update: Kernel, dropped_kernels: set[int],
                 dropped_tensors: set[int]) -> HostUpdate:
    """Drop `update`, its optimizer state and its next values; the weight it read and the
    gradient stay."""
    tensors = graph.tensors
    weight, grad = update.inputs[0], update.inputs[1]
    dropped_kernels.add(update.id)
    dropped_tensors.update(t for t in update.inputs if t not in (weight, grad))
    dropped_tensors.update(update.outputs)
    return HostUpdate(tensors[weight].name, tensors[grad].name, tensors[weight].numel)


def _unused_after(graph: TensorGraph, dropped_kernels: set[int]) -> set[int]:
    """Given tensors that only dropped kernels read (the learning rate tensor)."""
    return {t.id for t in graph.tensors if t.producer is None and t.users
            and t.role not in (Role.INPUT, Role.LABEL)
            and all(u in dropped_kernels for u in t.users)}


def _rebuild(graph: TensorGraph, dropped_kernels: set[int], dropped_tensors: set[int],
             drained: set[str], records: tuple[HostUpdate, ...]) -> TensorGraph:
    b = GraphBuilder(graph.name)
    kept_kernels = [k.id for k in graph.kernels if k.id not in dropped_kernels]
    remap: dict[int, int] = {}
    for t in graph.tensors:
        if t.id in dropped_tensors:
            continue
        remap[t.id] = b.add_tensor(t.name, t.shape, t.dtype, t.role)
        if t.id in graph.constants:
            b.constants[remap[t.id]] = graph.constants[t.id]
    for k in graph.kernels:
        if k.id not in dropped_kernels:
            b.add_kernel(k.op_type, [remap[t] for t in k.inputs], [remap[t] for t in k.outputs],
                         name=k.name, domain=k.domain, attrs=k.attrs_dict,
                         workspace_bytes=k.workspace_bytes)
    kept = [remap[t] for t in graph.outputs if t in remap]
    b.inputs = [remap[t] for t in graph.inputs if t in remap]
    b.outputs = kept + [remap[graph.by_name(n).id] for n in sorted(drained)
                        if remap[graph.by_name(n).id] not in kept]
    b.carried = [(remap[a], remap[z]) for a, z in graph.carried if a in remap and z in remap]
    b.meta = {**graph.meta, "training": _training_meta(graph, remap, kept_kernels, drained),
              META_KEY: tuple(astuple(u) for u in records)}
    return b.build()


def _training_meta(graph: TensorGraph, remap: dict[int, int], kept_kernels: list[int],
                   drained: set[str]) -> dict[str, object]:
    """meta["training"] with the ids of the GPU's graph: the weight gradient pairs of the
    updates it keeps (the others are the host's), and the learning-rate tensor if they read
    it."""
    meta = dict(graph.meta.get("training") or {})
    for key in ("loss", "labels"):
        if key in meta:
            meta[key] = remap[meta[key]]
    if "loss_kernel" in meta:
        meta["loss_kernel"] = kept_kernels.index(meta["loss_kernel"])
    if "forward_kernels" in meta:
        meta["forward_kernels"] = sum(k < meta["forward_kernels"] for k in kept_kernels)
    lr = meta.pop("lr_tensor", None)
    if lr in remap:  # the GPU's updates read it
        meta["lr_tensor"] = remap[lr]
    meta["weight_grads"] = tuple((remap[w], remap[g]) for w, g in meta.get("weight_grads", ())
                                 if graph.tensors[g].name not in drained)
    return meta
