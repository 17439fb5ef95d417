"""Models as workloads: an ONNX file or zoo model built into the training graph its options
describe (`load_graph`), priced with the profiles of a device (`load_workload`,
`device_costs`), with its convolution backward kernels split (`split_workload`), the values
a run starts from (`initial_values`), the budget a config gives it (`user_budget`) and the
order of its updates under that budget (`ordered_updates`). The composition floor's first
unit: `pipeline` plans and runs what these build (docs/developer.md, "Layers").
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotm_py.config import default_memory
from autotm_py.costs import KernelCosts
from autotm_py.errors import ConfigError
from autotm_py.frontend.onnx import import_onnx
from autotm_py.frontend.onnx_load import check_external_locations
from autotm_py.frontend.weights import initializer_values
from autotm_py.frontend.zoo import ZOO, build_graph
from autotm_py.ir.conv_split import (
    CHUNKS_ATTR,
    chunked_time_factor,
    part_origins,
    split_conv_grads,
    split_names,
)
from autotm_py.ir.host_updates import offload_updates
from autotm_py.ir.layout import to_channels_last
from autotm_py.ir.precision import with_precision
from autotm_py.ir.training import derive_training
from autotm_py.ir.update_order import early_order, in_early_order, updates_early
from autotm_py.memory import accounting
from autotm_py.memory.tiers import MemorySystem, load_memory_system
from autotm_py.options import HOST_UPDATES_KEY, SOURCE_META_KEY, UPDATES_EARLY_KEY, ModelOptions
from autotm_py.profiling.fingerprint import detected_gpu
from autotm_py.profiling.profile import load_costs
from autotm_py.profiling.profile import profile as profile_kernels

if TYPE_CHECKING:
    from autotm_py.config import PlanConfig
    from autotm_py.ir.graph import TensorGraph
    from autotm_py.plan import Plan

PathLike = str | os.PathLike[str]


def load_graph(model: PathLike, options: ModelOptions | None = None) -> TensorGraph:
    """An ONNX file or zoo model as the `TensorGraph` that `options` (`ModelOptions`) describe."""
    options = options or ModelOptions()
    path = Path(model)
    dims = dict(options.dims or {})
    if path.exists() or path.suffix == ".onnx" or os.sep in str(model):
        graph = import_onnx(path, batch=options.batch, dims=dims, fuse=options.fuse)
        source = str(path.resolve())
    elif str(model) in ZOO:
        graph = build_graph(str(model), batch=options.batch, dims=dims, fuse=options.fuse)
        source = str(model)
    else:
        raise ConfigError(f"model {str(model)!r} is neither an existing file nor a zoo model "
                          f"({', '.join(sorted(ZOO))}); see `autotm zoo list`")
    graph = replace(graph, meta={**graph.meta, SOURCE_META_KEY: source})
    graph = with_precision(graph, options.precision)
    if options.training:
        graph = derive_training(graph, optimizer=options.optimizer or "sgd",
                                loss=options.loss or "auto", loss_chunks=options.loss_chunks)
    graph = to_channels_last(graph) if options.channels_last else graph
    # a plan made for a graph with its updates moved early (`ir.update_order`) rebuilds that
    graph = updates_early(graph) if options.updates_early else graph
    # a plan made for a graph with its convolution backward kernels split rebuilds them
    graph = split_conv_grads(graph, options.split_conv_grads) \
        if options.split_conv_grads else graph
    return offload_updates(graph, options.host_share) if options.host_updates else graph


@dataclass(frozen=True)
class Workload:
    """A model built and priced once: its graph and its kernel costs."""

    graph: TensorGraph
    costs: KernelCosts


def load_workload(model: PathLike, options: ModelOptions, *, device: str = "cuda",
                  gpu: str | None = None, profiles_dir: PathLike | None = None,
                  shipped_dir: PathLike | None = None) -> Workload:
    """The graph `options` build of `model`, priced with the profiles of `device` (of the GPU
    `gpu` names, in GPU mode). `shipped_dir` stands in for the shipped profiles (a bench
    worker's copy of them)."""
    graph = load_graph(model, options)
    return Workload(graph, load_costs(graph, device=device, profiles_dir=profiles_dir,
                                      shipped_dir=shipped_dir, gpu=gpu))


def split_workload(work: Workload, names: Sequence[str] | None = None, *, device: str = "cuda",
                   gpu: str | None = None, profiles_dir: PathLike | None = None,
                   shipped_dir: PathLike | None = None) -> Workload:
    """`work` with the fused convolution backward kernels and recurrent kernels
    `names` (None: every one) split into their parts or batch chunks (`ir.conv_split`): the
    kernels kept cost what they did, the parts what the profiles say, or what the measured
    kernel gives them where the profiles only estimate them (`KernelCosts.spliced`)."""
    split = split_conv_grads(work.graph, names)
    if split is work.graph:
        return work
    fresh = load_costs(split, device=device, profiles_dir=profiles_dir, shipped_dir=shipped_dir,
                       gpu=gpu)
    chunked = [k for k in split.kernels if int(k.attr(CHUNKS_ATTR, 1)) > 1]
    return Workload(split, work.costs.spliced(
        part_origins(work.graph, split), fresh, {k.id: int(k.attr(CHUNKS_ATTR)) for k in chunked},
        {k.id: chunked_time_factor(k) for k in chunked}))




def device_costs(graph: TensorGraph, device: str, gpu: str | None = None, *,
                 measure: bool = False) -> KernelCosts:
    """The kernel costs of `graph` on `device` ("cuda" prices with `gpu`'s profiles);
    `measure`: first measure on this machine the kernels no profile has (cached)."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    if measure:
        return profile_kernels(graph, device=kind, progress=False)
    return load_costs(graph, device=kind, gpu=gpu if kind == "cuda" else None)


def initial_values(graph: TensorGraph, model: PathLike, seed: int = 0
                   ) -> tuple[dict[int, Any], str]:
    """The values a run of `graph` starts from, and what they are in words: an ONNX file's own
    initializers where it has data for them, seeded random values for every other tensor
    without a producer (all of them for a zoo model, whose weights no file holds)."""
    from autotm_py.kernels.util import in_layout, torch_dtype
    from autotm_py.runtime.reference import init_values

    masters = init_values(graph, seed=seed)
    path = Path(model)
    if not (path.is_file() and path.suffix == ".onnx"):
        return masters, (f"seeded random values (--seed {seed}): a zoo model has no weights "
                         "of its own (times and memory do not depend on them)")
    found = initializer_values(path, graph)
    import torch

    for tid, value in found.values.items():
        t = graph.tensors[tid]
        masters[tid] = in_layout(torch.from_numpy(value).to(torch_dtype(t.dtype)), t)
    text = f"the file's own weights ({len(found.values)})"
    if found.missing:
        text += (f"; external data {', '.join(_missing_data_files(path))} is missing: seeded "
                 f"random values (--seed {seed}) for the {len(found.missing)} weights it holds")
    return masters, text


def _missing_data_files(path: Path) -> list[str]:
    """The external-data files that `path` names and its folder lacks."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    return sorted(check_external_locations(proto, path.parent, str(path))) or ["(unknown)"]


def planned_graph(graph: TensorGraph, plan: Plan) -> TensorGraph:
    """The graph `plan` is for, made from `graph`: with its updates early and the kernels
    split as the plan's model options say (`optimize` may plan a reordered or split graph of
    the one it was given: `PlanConfig.update_order`, `--split-conv-grads`)."""
    model = plan.header.model
    if model is not None and model.updates_early and not graph.meta.get(UPDATES_EARLY_KEY):
        graph = updates_early(graph)
    recorded = model.split_conv_grads if model else ()
    if not recorded or split_names(graph):
        return graph
    return split_conv_grads(graph, recorded)


# ---- budgets and the graph a budget plans ------------------------------------------------
def for_this_gpu(config: PlanConfig) -> PlanConfig:
    """`config` for the GPU the plan runs on: in GPU mode without `--gpu` or `--memory`, the
    link of this machine's GPU where it has one. (Its kernel times come from this GPU's
    profiles already: `profiling.fingerprint.target_fingerprint`.)"""
    if config.device != "cuda" or config.gpu is not None or config.memory is not None:
        return config
    gpu = detected_gpu()
    return config if gpu is None else replace(config, memory=default_memory("cuda", gpu))


def _memory_system(config: PlanConfig) -> MemorySystem:
    memory = load_memory_system(config.memory_name)
    if config.reserve_bytes is not None:
        memory = replace(memory, runtime_reserve_bytes=int(config.reserve_bytes))
    return memory


def user_budget(graph: TensorGraph, config: PlanConfig,
                memory: MemorySystem | None = None) -> int | None:
    """The budget `config` gives `graph`, in bytes (its ratio resolved against the graph's
    peak), without loading any costs."""
    memory = memory or _memory_system(config)
    pinned = accounting.pinned_tensors(graph, config.pin_weights)
    return accounting.resolve_budget(graph, ratio=config.ratio,
                                     fast_mem_bytes=config.fast_mem_bytes, pinned=pinned,
                                     memory=memory)


def ordered_updates(graph: TensorGraph, config: PlanConfig, costs: KernelCosts | None
                    ) -> tuple[TensorGraph, KernelCosts | None]:
    """The graph to plan and its costs: with the optimizer updates early where
    `config.update_order` says so ("auto": under a budget below the graph's peak; never for a
    graph whose updates run on the host), else `graph` and `costs` as given."""
    mode = config.update_order
    if mode == "end" or graph.meta.get(HOST_UPDATES_KEY):
        return graph, costs
    if mode == "auto":
        budget = user_budget(graph, config)
        if budget is None or budget >= graph.peak_live_bytes:
            return graph, costs
    order = early_order(graph)
    if order is None:
        return graph, costs
    return in_early_order(graph, order), None if costs is None else costs.reordered(order)
