"""The Python API: thin functions over the pipeline and the stages.

Everything the CLI does goes through here, so notebooks and benchmarks get the same behaviour.
Only what needs torch (profiling, calibrating, executing) imports it, when called.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from autotm_py import pipeline
from autotm_py.config import PlanConfig, default_memory
from autotm_py.errors import ConfigError
from autotm_py.frontend.onnx import import_onnx as _import_onnx
from autotm_py.frontend.zoo.dlrm import KAGGLE_TABLES
from autotm_py.ir.conv_split import split_conv_grads as _split_conv_grads
from autotm_py.ir.conv_split import split_variants as _split_variants
from autotm_py.ir.training import derive_training as _derive_training
from autotm_py.memory.tiers import load_memory_system
from autotm_py.options import SOURCE_META_KEY, Measure, ModelOptions, RunMode
from autotm_py.planning.baselines import BASELINES, BaselineResult
from autotm_py.planning.embedding_access import (
    EmbeddingTable,
    EmbeddingWorkload,
    workload_from_json,
)
from autotm_py.planning.embedding_study import make_lookups, study
from autotm_py.planning.embeddings import LookupCosts
from autotm_py.planning.feasibility import Smallest, smallest_budget
from autotm_py.profiling import profile as _profiling
from autotm_py.profiling.calibrate import calibrate as _calibrate
from autotm_py.profiling.value_file import load_values as _load_values
from autotm_py.profiling.value_file import value_fills as _value_fills

if TYPE_CHECKING:
    from autotm_py.costs import KernelCosts
    from autotm_py.ir.graph import TensorGraph
    from autotm_py.memory.tiers import MemorySystem
    from autotm_py.plan import Plan
    from autotm_py.planning.control import SolveControl
    from autotm_py.planning.solve import PlanResult
    from autotm_py.runtime.execute import RunResult
    from autotm_py.runtime.simulate_result import SimulationResult

PathLike = str | os.PathLike[str]


def import_onnx(path: PathLike, *, batch: int | None = None,
                dims: Mapping[str, int] | None = None, fuse: bool = True) -> TensorGraph:
    """Read an ONNX file (weights as shapes only) into a forward `TensorGraph`; attention and
    GELU patterns are fused unless `fuse` is False (docs/fusion.md)."""
    return _import_onnx(path, batch=batch, dims=dims, fuse=fuse)


def derive_training(graph: TensorGraph, *, optimizer: str = "sgd",
                    learning_rate: float = 0.01, loss: str = "auto",
                    loss_chunks: int = 1) -> TensorGraph:
    """Forward + loss + backward + optimizer update: one training iteration. `loss`: auto,
    ce-axis1, ce-last or mse; `loss_chunks` > 1: a language model's head and loss as one
    kernel over that many blocks of rows (docs/training.md)."""
    return _derive_training(graph, optimizer=optimizer, learning_rate=learning_rate, loss=loss,
                            loss_chunks=loss_chunks)


def load_model(model: PathLike, options: ModelOptions | None = None,
               **fields: Any) -> TensorGraph:
    """An ONNX file path, or the name of a zoo model (built in memory), as a `TensorGraph`.
    `options` (`options.ModelOptions`), or its fields as keywords: `batch`, `dims`, `training`,
    `optimizer` (sgd or adam), `fuse=False` (`--no-fuse`: no attention, GELU, Linear or
    convolution + ReLU fused), `loss` (`--loss`), `loss_chunks` (`--loss-chunks`),
    `channels_last` (`--channels-last`, docs/layout.md), `precision` ("fp32" or "bf16",
    `--precision`, docs/precision.md)."""
    if options is not None and fields:
        raise ConfigError("give load_model either options or their fields, not both")
    return pipeline.load_graph(model, options or ModelOptions(**fields))


def profile(graph: TensorGraph, *, device: str = "cpu", profiles_dir: PathLike | None = None,
            **options: Any) -> KernelCosts:
    """Measure every unique kernel on `device` (cached), return the graph's costs."""
    return _profiling.profile(graph, device=device, profiles_dir=profiles_dir, **options)


def planned_graph(graph: TensorGraph, plan: Plan) -> TensorGraph:
    """The graph `plan` was made for, from the graph of its model: with the optimizer updates
    early and the kernels split as its header records (`optimize` may plan a reordered or
    split graph: `PlanConfig.update_order`, `split_conv_grads`)."""
    return pipeline.planned_graph(graph, plan)


def split_conv_grads(graph: TensorGraph, names: Sequence[str] | None = None) -> TensorGraph:
    """`graph` with its fused convolution backward kernels `names` (None: all) split into
    their filter and data parts, and its recurrent kernels named into batch chunks
    (`ir.conv_split`; `optimize --split-conv-grads`)."""
    return _split_conv_grads(graph, names)


def split_variants(graph: TensorGraph) -> list[TensorGraph]:
    """The split graphs of `graph` whose kernels `profile --split-conv-grads` measures: the
    default split, its recurrent kernels in each power-of-two count of batch chunks, and its
    forward convolutions and split backward kernels' parts in 2 to 8 (`PROFILED_CONV_CHUNKS`)."""
    return _split_variants(graph)


def load_costs(graph: TensorGraph, *, device: str = "cuda",
               profiles_dir: PathLike | None = None,
               shipped_dir: PathLike | None = None, gpu: str | None = None) -> KernelCosts:
    """Costs from shipped/cached profiles; kernels without one get flagged estimates.
    `shipped_dir` stands in for the shipped profiles (a bench worker's copy of them). `gpu`
    (cuda): price for that GPU's profiles ("h200"), not this machine's."""
    return _profiling.load_costs(graph, device=device, profiles_dir=profiles_dir,
                                 shipped_dir=shipped_dir, gpu=gpu)


def default_layout(graph: TensorGraph, costs: KernelCosts, *,
                   profiles_dir: PathLike | None = None,
                   gpu: str | None = None) -> tuple[TensorGraph, KernelCosts]:
    """`graph` (and its `costs`, from `load_costs`) in the layout a GPU plan defaults to:
    channels-last where the model has convolutions and the profiles that price it have its
    channels-last kernels, else as it is (docs/layout.md). Host-mode costs: as it is."""
    return _profiling.default_layout(graph, costs, profiles_dir=profiles_dir, gpu=gpu)


def calibrate(*, device: str = "cuda", **options: Any) -> MemorySystem:
    """Measure the host<->GPU link of this machine into a GPU-mode memory system."""

    return _calibrate(device, **options)


def for_this_gpu(config: PlanConfig) -> PlanConfig:
    """`config` for the GPU that will run its plan: in GPU mode without `gpu` or `memory`, the
    link of this machine's GPU where it has one (its profiles price the plan already).
    `optimize` does the same."""
    return pipeline.for_this_gpu(config)


def optimize(graph: TensorGraph, config: PlanConfig | None = None, *,
             costs: KernelCosts | None = None, profiles_dir: PathLike | None = None,
             baselines: bool | Sequence[str] = False,
             control: SolveControl | None = None) -> PlanResult:
    """Solve the placement ILP; infeasible budgets come back as a result, not an exception.
    Costs: `costs`, else the profiles (`profiles_dir`, else the cache and shipped profiles).
    `baselines`: also plan and simulate the baselines (True: all) for comparison.
    `control` (`planning.control.SolveControl`): progress callbacks and stop requests; with
    `planning.control.handle_signals(control)` around the call, Ctrl-C stops the search and
    keeps the best plan found so far."""
    return pipeline.optimize(graph, config or PlanConfig(), costs=costs,
                             profiles_dir=profiles_dir, baselines=baselines, control=control)


def useful_budgets(graph: TensorGraph, config: PlanConfig | None = None, *,
                   costs: KernelCosts | None = None,
                   profiles_dir: PathLike | None = None) -> tuple[Smallest, int]:
    """Where planning `graph` under `config` (its budget ignored) is worth it: the smallest
    feasible budget with its parts and forcing kernel (`planning.feasibility.Smallest`;
    `optimize` with the same options names the same figure when a budget is below it), and
    the bytes of the plan's tensors at the all-fast peak (`Smallest.budget_for` gives the
    budget at which everything fits)."""
    config = replace(config or PlanConfig(), ratio="1:0", fast_mem_bytes=None)  # no budget
    machine = pipeline.machine_for(graph, config, costs, profiles_dir=profiles_dir)
    return smallest_budget(machine, config.strategy), machine.peak[0]


def baselines(graph: TensorGraph, config: PlanConfig | None = None, *,
              costs: KernelCosts | None = None, profiles_dir: PathLike | None = None,
              names: tuple[str, ...] | None = None) -> dict[str, BaselineResult]:
    """Plan and simulate the baselines (all-fast, all-slow, first-touch, lru, offload, 2lm) at
    the budget of `config`: name -> `planning.baselines.BaselineResult`."""
    machine = pipeline.machine_for(graph, config or PlanConfig(), costs,
                                   profiles_dir=profiles_dir)
    return pipeline.run_baselines(machine, names or BASELINES)


def simulate(graph: TensorGraph, plan: Plan, *, costs: KernelCosts | None = None,
             strict: bool = True, profiles_dir: PathLike | None = None,
             join_at_use: bool = True) -> SimulationResult:
    """Predicted timeline and memory curve of a plan; strict mode raises at a violation.
    `join_at_use=False`: async copies joined at the end of the kernel they overlap (AutoTM's
    runtime, and the ILP's objective) instead of where their tensors are used (ours)."""
    return pipeline.simulate(graph, plan, costs=costs, strict=strict,
                             profiles_dir=profiles_dir, join_at_use=join_at_use)


def profile_in_context(graph: TensorGraph, *, device: str = "cuda",
                       profiles_dir: PathLike | None = None, iterations: int = 5,
                       warmup: int = 2) -> KernelCosts:
    """Time every kernel inside real all-fast iterations on the GPU; cache; return costs."""
    return pipeline.profile_in_context(graph, device=device, profiles_dir=profiles_dir,
                                       iterations=iterations, warmup=warmup)


def profile_values(graph: TensorGraph, *, device: str = "cpu", iterations: int = 3,
                   seed: int = 0, memory: str | None = None) -> dict[str, Any]:
    """Run `iterations` all-fast iterations through the executor and classify every tensor's
    values (zero, constant, low-entropy, varied; unchanged between iterations), with its bytes
    and the copy time out and back at `memory`'s link (default: the GPU-mode default). The
    initial values are those `autotm run` uses (an ONNX file's own weights, else seeded
    random). Returns the JSON document `autotm profile --values -o` writes (docs/values.md);
    `PlanConfig(fills=value_fills(doc))` lets the planner use it."""
    from autotm_py.profiling.values import profile_values as _profile_values

    masters, weights = pipeline.initial_values(graph, graph.meta.get(SOURCE_META_KEY) or "",
                                               seed)
    system = load_memory_system(memory or default_memory("cuda"))
    return _profile_values(graph, pipeline.all_fast_plan(graph), masters=masters,
                           memory=system, device=device, iterations=iterations,
                           weights=weights)


def load_values(path: PathLike) -> dict[str, Any]:
    """A value profile that `autotm profile --values FILE` wrote."""
    return _load_values(path)


def value_fills(doc: Mapping[str, Any]) -> tuple[tuple[str, float], ...]:
    """The planner's facts from a value profile: (tensor name, value) of each tensor found
    all zero or one constant (`PlanConfig.fills`)."""
    return _value_fills(doc)


def execute(graph: TensorGraph, plan: Plan, *, device: str = "cuda",
            mode: RunMode | None = None, measure: Measure | None = None,
            costs: KernelCosts | None = None, masters: Mapping[int, Any] | None = None,
            **fields: Any) -> RunResult:
    """Run a plan for real with torch and measure it. `mode` (`options.RunMode`): how it runs,
    e.g. `RunMode(arena=True, replay=True)`: every fast copy at its planned offset (a plan without
    an arena is packed first, `with_arena`) and the timed iterations replayed from one CUDA graph; a
    replay without an arena runs with static inputs on torch's caching allocator
    (experiments/journal/gpu-2026-11.md, "Capped replay with static inputs"). Where no arena can
    serve the plan (packed now, it would exceed the capped budget), the run falls back to torch's
    caching allocator, eagerly, and its notes say why. `measure` (`options.Measure`), or its fields
    as keywords: iterations, warmup, seed, capped, kernel_times, device_busy, ... `masters`: initial
    values of the tensors without a producer, by tensor id (else seeded random values)."""
    if measure is not None and fields:
        raise ConfigError("give execute either measure or its fields, not both")
    return pipeline.execute(graph, plan, device=device, mode=mode,
                            measure=measure or Measure(**fields), costs=costs, masters=masters)


def prepare_cuda_process(plan: Plan, device: str, mode: RunMode | None = None, *,
                         capped: bool = True) -> list[str]:
    """Before anything else touches CUDA in this process: what a run of `plan` in `mode`
    needs set up first (one hardware work queue for a replay, the placed allocator for an
    arena run; `pipeline.prepare_cuda_process`). Returns the notes of what could not be set."""
    return pipeline.prepare_cuda_process(plan, device, mode or RunMode(), capped)


def measure_autograd(graph: TensorGraph, *, device: str = "cuda", iterations: int = 5,
                     warmup: int = 2, save_on_cpu: bool = False, **options: Any) -> RunResult:
    """The native reference: torch.autograd training iterations of a training graph's forward
    kernels and `torch.optim` (`save_on_cpu`: with activations offloaded to pinned host
    memory, as `torch.autograd.graph.save_on_cpu` does), timed (`runtime.eager`)."""
    from autotm_py.runtime.eager import measure_autograd as measure

    return measure(graph, device=device, iterations=iterations, warmup=warmup,
                   save_on_cpu=save_on_cpu, **options)


def fit_checkpointing(graph: TensorGraph, budget_bytes: int, *, device: str = "cuda",
                      iterations: int = 5, warmup: int = 2) -> RunResult | None:
    """The native reference under a cap: PyTorch activation checkpointing of the same graph
    with the fewest segments that fit `budget_bytes` (None when no count fits)."""
    from autotm_py.runtime.eager import fit_checkpointing as fit

    return fit(graph, budget_bytes, device=device, iterations=iterations, warmup=warmup)


def with_arena(graph: TensorGraph, plan: Plan, costs: KernelCosts | None = None, *,
               profiles_dir: PathLike | None = None) -> Plan:
    """`plan` with every fast buffer at a packed offset (unchanged if it has an arena). A plan
    planned without `--arena` may need more than its budget this way; `simulate` says so."""
    return pipeline.with_arena(graph, plan, costs, profiles_dir=profiles_dir)


def embedding_workload(model: PathLike = "dlrm", *, dim: int = 128, table_scale: int = 2,
                       batch: int | None = None, pooling: int | None = None,
                       block_rows: int | None = None) -> EmbeddingWorkload:
    """The embedding tables of a model as shapes (docs/embeddings.md): ``dlrm`` (the zoo's
    Criteo Kaggle tables x `table_scale`, `dim` wide: 34.6 GB at the defaults; the dense part's
    memory is the zoo DLRM's inference peak without its tables), or a workload JSON file."""
    fields = {"batch": batch, "pooling": pooling, "block_rows": block_rows}
    if str(model) != "dlrm":
        return workload_from_json(model, **fields)
    batch = batch or 2048
    graph = load_model("dlrm", batch=batch)
    tables = [t for t in graph.tensors if t.name.startswith("emb.")]
    dense = graph.peak_live_bytes - sum(t.nbytes for t in tables)
    return EmbeddingWorkload(
        f"dlrm (Kaggle tables x{table_scale}, dim {dim})",
        tuple(EmbeddingTable(f"emb.{i}", rows * table_scale, dim)
              for i, rows in enumerate(KAGGLE_TABLES)),
        batch=batch, pooling=pooling or 1, block_rows=block_rows or 4096, dense_bytes=dense)


def plan_embeddings(workload: EmbeddingWorkload, budgets: Sequence[int], *,
                    alpha: float | None = 1.05, seed: int = 0, trace: PathLike | None = None,
                    memory: str = "h200-pcie5", profile_batches: int = 32,
                    held_batches: int = 8, copy_ahead: bool = True,
                    time_limit: float | None = 30.0, with_lru: bool = True,
                    scatter: bool = True, **costs: float) -> dict[str, Any]:
    """Block placement of `workload`'s tables for each HBM budget (bytes): the ILP against
    hot-first greedy, an LRU row cache, all-host (zero-copy) and all-HBM, planned on measured
    counts of `profile_batches` batches and priced on the `held_batches` after them. `costs`:
    fields of `planning.embeddings.LookupCosts` to override (e.g. ``dense_s``). `scatter`
    False: the Zipf ranks are the row ids (a deployment that renumbered rows offline)."""
    priced = LookupCosts.from_memory(load_memory_system(memory), **costs)
    lookups = make_lookups(workload, alpha=alpha, seed=seed,
                           trace_path=None if trace is None else str(trace),
                           profile_batches=profile_batches, held_batches=held_batches,
                           scatter=scatter)
    result = study(workload, lookups, priced, budgets, copy_ahead=copy_ahead,
                   time_limit=time_limit, with_lru=with_lru)
    result["memory"] = memory
    return result
