"""What a sweep covers (`BenchSpec`), how its rows are keyed (`ROW_KEY`), and their columns."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autotm_py import api
from autotm_py.config import (
    DEFAULT_READ_PRICING,
    DEFAULT_SOLVER,
    DEFAULT_STRATEGY,
    DEFAULT_WRITE_PRICING,
    STRATEGIES,
    PlanConfig,
)
from autotm_py.errors import AutoTMError, ConfigError
from autotm_py.ir import has_convolutions, is_channels_last
from autotm_py.memory import load_memory_system
from autotm_py.options import ModelOptions, RunMode, default_run_mode
from autotm_py.pipeline import for_this_gpu, load_graph
from autotm_py.planning import SOLVERS
from autotm_py.profiling import Fingerprint, held_logs
from autotm_py.units import parse_ratio

ROW_KEY = ("model", "batch", "dims", "training", "device", "memory", "ratio", "strategy",
           "solver", "options")
# baselines in the order of the columns; names as in `autotm_py.planning.baselines`
BASELINES = ("all_fast", "all_slow", "first_touch", "lru", "offload", "2lm")
FIT_STEP = 0.05
FIT_MAX = 0.25
COLUMNS = (
    *ROW_KEY, "mode", "budget_bytes", "peak_bytes", "max_working_set_bytes", "kernels",
    "status", "min_feasible_budget_bytes", "forced_by", "variables", "constraints",
    "build_s", "solve_s", "gap", "hit_time_limit",
    "predicted_s", "all_fast_s", "slowdown", "all_slow_s", "first_touch_s", "lru_s",
    "offload_s", "2lm_s", "oracle_s", "transfer_bound_s", "bytes_to_fast", "bytes_to_slow",
    "sync_bytes_to_fast",
    "sync_bytes_to_slow", "async_bytes_to_fast", "async_bytes_to_slow", "recomputes",
    "recompute_s", "input_fast_fraction",
    "output_fast_fraction", "peak_fast_bytes", "estimated_kernels", "scaled_kernels",
    "borrowed_kernels",
    "measured_s",
    "measured_peak_fast_bytes", "measured_host_s", "measured_alloc_retries", "headroom",
    "measured_all_fast_s", "measured_all_slow_s",
    "measured_first_touch_s", "measured_lru_s", "measured_offload_s",
    "measured_all_fast_peak_bytes", "measured_all_slow_peak_bytes",
    "measured_first_touch_peak_bytes", "measured_lru_peak_bytes",
    "measured_offload_peak_bytes", "measured_torch_autograd_s",
    "measured_torch_autograd_peak_bytes", "measured_save_on_cpu_s",
    "measured_save_on_cpu_peak_bytes", "measured_checkpoint_s",
    "measured_checkpoint_peak_bytes", "checkpoint_segments", "measured_reserved_peak_bytes",
    "measured_replayed", "measured_placed_outputs", "measured_copied_outputs",
    "measured_device_busy_s", "measured_device_span_s", "measured_all_fast_device_busy_s",
    "error", "notes",
    "machine", "device_name", "versions", "date",
)


@dataclass(frozen=True)
class BenchSpec:
    """What to sweep. Every (model, ratio, plan name, solver) makes one row. `strategies`
    mean what `optimize --strategy` does (`config.parse_strategy`): ``static``, ``sync``,
    ``async`` with `recompute` (auto: on in GPU mode, off in host mode), or plan names that fix
    it (``async+recompute``, ``recompute-only``). Each row is named by the plan name its
    strategy gives (`plan_names`): ``sync``/``async`` move only, ``sync+recompute``/
    ``async+recompute`` keep, move or recompute, ``recompute-only`` never copies. The defaults
    are `optimize`'s: async on a GPU, with recompute, an arena and replay."""

    models: tuple[str, ...]
    ratios: tuple[str, ...]
    strategies: tuple[str, ...] = (DEFAULT_STRATEGY,)
    solvers: tuple[str, ...] = (DEFAULT_SOLVER,)
    device: str = "cuda"
    memory: str | None = None
    # how every model is built (`options.ModelOptions`: batch, dims, training, loss, ...)
    model: ModelOptions = field(default_factory=ModelOptions)
    time_limit_s: float | None = None
    gap: float = 0.01
    # Solver threads per ILP (None: the solver's default); a parallel sweep gives each cell
    # this many CPUs (`bench/engines.py`).
    threads: int | None = None
    pin_weights: bool = False
    profiles_dir: str | None = None
    execute: bool = False  # run every plan for real (GPU) and record measured times
    iterations: int = 5
    warmup: int = 2
    # Where solved plans are kept: a cell whose plan is there is not solved again (plan on a
    # CPU machine, carry the folder, execute on the GPU machine).
    plans_dir: str | None = None
    headroom: float = 0.0  # share of each budget left free for fragmentation
    # AutoTM's defrag loop: re-plan with FIT_STEP more headroom (up to FIT_MAX) while a plan
    # runs out of memory under its cap or makes the allocator retry (when every headroom
    # retries, the fastest run is kept).
    fit: bool = False
    # How the plans are made and run (GPU mode, `options.RunMode`): `run.arena` plans every
    # fast buffer at an offset in one arena (`optimize --arena`) and runs each plan there, in a
    # process of its own (`bench/child.py`); `run.replay` prices and runs the iteration as a
    # CUDA-graph replay (the all-fast reference too, with static inputs); `run.placed` (with
    # an arena) plans for and runs with the placed allocator; `run.scratch` as `optimize
    # --scratch`. Baselines and native runs are the same either way. None: the device's
    # default (`options.default_run_mode`).
    run: RunMode = None  # type: ignore[assignment]  # set in __post_init__
    read_pricing: str = DEFAULT_READ_PRICING  # `optimize --read-pricing`
    write_pricing: str = DEFAULT_WRITE_PRICING  # `optimize --write-pricing`
    gpu: str | None = None  # `--gpu`: plans priced with this GPU's profiles (GPU mode)
    recompute: str = "auto"  # `--recompute`, for the strategies that do not fix it
    # `--split-conv-grads`: every model's fused convolution backward kernels split into their
    # parts (`ir.conv_split`) before anything is planned or run; its ratios divide the split
    # graph's peak, and its rows and plans are named "+split"
    split_conv_grads: bool = False

    def __post_init__(self) -> None:
        if not self.models or not self.ratios:
            raise ConfigError("bench needs at least one model (--models) and one ratio "
                              "(--ratios), e.g. --models resnet50 --ratios 1:4")
        if self.run is None:
            object.__setattr__(self, "run", default_run_mode(self.device))
        for r in self.ratios:
            parse_ratio(r, flag="--ratios")
        # plan_names validates each strategy, the device, gap, limit and headroom up front
        if not self.strategies or not self.plan_names:
            raise ConfigError("--strategies: give at least one, e.g. --strategies async")
        if (self.run.arena or self.run.replay) and self.device != "cuda":
            raise ConfigError(f"--{'arena' if self.run.arena else 'replay'} is for the GPU "
                              "mode (plans at planned addresses or replayed as CUDA graphs): "
                              "add --device cuda")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads {self.threads}: at least 1")
        if self.fit and not self.execute:
            raise ConfigError("--fit needs --execute: it re-plans the plans that do not fit "
                              "when they run")
        bad = [s for s in self.solvers if s not in SOLVERS]
        if bad or not self.solvers:
            raise ConfigError(f"--solvers {','.join(self.solvers)}: unknown solver "
                              f"{bad[0] if bad else '(none)'}; choose from {', '.join(SOLVERS)}")
        load_memory_system(self.memory_name)  # a bad --memory fails before the sweep starts

    @property
    def plan_names(self) -> tuple[str, ...]:
        """The plan names the strategies mean on this sweep's device with its `recompute`
        (the plan names among them keep their own), in the order given, once each: the rows'
        `strategy` (`async` on a GPU: async+recompute)."""
        return tuple(dict.fromkeys(
            PlanConfig(strategy=s, recompute=self.recompute if s in STRATEGIES else "auto",
                       **self._settings()).plan_name for s in self.strategies))

    def plan_config(self, strategy: str, ratio: str | None = None,
                    solver: str = DEFAULT_SOLVER) -> PlanConfig:
        """How a cell is planned: the config of its plan name (`plan_names`) with this sweep's
        settings."""
        return PlanConfig.for_plan_name(
            strategy, **self._settings(ratio=None if ratio is None else parse_ratio(ratio),
                                       solver=solver))

    def _settings(self, **kwargs: Any) -> dict[str, Any]:
        return dict(device=self.device, memory=self.memory, gap=self.gap,
                    time_limit_s=self.time_limit_s, pin_weights=self.pin_weights,
                    headroom=self.headroom, threads=self.threads, run=self.run,
                    read_pricing=self.read_pricing, write_pricing=self.write_pricing,
                    gpu=self.gpu, **kwargs)

    @property
    def memory_name(self) -> str:
        # the link of the GPU the plans run on: `--gpu`, else this machine's (as planning does)
        return for_this_gpu(PlanConfig(device=self.device, memory=self.memory,
                                       gpu=self.gpu)).memory_name

    def key_values(self, model: str, ratio: str, strategy: str, solver: str) -> dict[str, Any]:
        """A row's key columns. Dims (e.g. "seq=512") are part of it: sweeps of one model at
        two sequence lengths into one output are two rows, and two plans in `plans_dir`."""
        return {"model": model, "batch": self.model.batch, "dims": self.dims_text,
                "training": self.model.training, "device": self.device, "memory": self.memory_name,
                "ratio": ratio, "strategy": strategy, "solver": solver,
                "options": self.options}

    def row_key(self, model: str, ratio: str, strategy: str, solver: str) -> tuple[str, ...]:
        values = self.key_values(model, ratio, strategy, solver)
        return tuple(cell_text(values[k]) for k in ROW_KEY)

    @property
    def options(self) -> str | None:
        """How plans are made and run beyond their strategy, as a row's key names it: None for
        the defaults (eager runs on torch's allocator, step-priced reads and writes; older
        results have no such column), else e.g. ``arena+replay+placed``,
        ``arena+replay+placed+windows``, ``arena+replay+placed+spread`` (spread reads;
        ``+writes-spread``: spread writes) or, for graphs with a chunked loss, ``...+loss16``;
        plans priced for another GPU's profiles end in its name, ``...+gpu-h200``. (Rows and
        plan files written before 2026-12-01 name replay ``graph``.)"""
        run, model = self.run, self.model
        parts = [name for name, on in (("arena", run.arena), ("replay", run.replay),
                                       ("placed", run.places_outputs),
                                       ("windows", run.windows),
                                       (self.read_pricing,
                                        self.read_pricing != DEFAULT_READ_PRICING),
                                       ("writes-spread",
                                        self.write_pricing != DEFAULT_WRITE_PRICING),
                                       (f"loss{model.loss_chunks}", model.loss_chunks > 1),
                                       ("nhwc", model.channels_last),
                                       (f"gpu-{gpu_slug(self.gpu or '')}", bool(self.gpu)),
                                       ("split", self.split_conv_grads),
                                       *self._model_parts())
                 if on]
        return "+".join(parts) or None

    def _model_parts(self) -> tuple[tuple[str, bool], ...]:
        """The model options beyond the defaults that no other key column names."""
        model = self.model
        return ((f"opt-{model.optimizer}", model.optimizer not in (None, "sgd")),
                (f"loss-{model.loss}", model.loss not in (None, "auto")),
                ("unfused", not model.fuse), ("bf16", model.precision == "bf16"))

    @property
    def dims_text(self) -> str | None:
        return ",".join(f"{k}={v}" for k, v in sorted(dict(self.model.dims).items())) or None

    def plan_path(self, model: str, ratio: str, strategy: str, solver: str,
                  headroom: float = 0.0) -> Path | None:
        if self.plans_dir is None:
            return None
        stem = plan_stem(self.row_key(model, ratio, strategy, solver))
        if headroom:
            stem += f"_h{headroom:.2f}"
        # compressed: a folder of plans for large models is carried to the GPU machine
        return Path(self.plans_dir) / f"{stem}.json.gz"

    def headrooms(self) -> tuple[float, ...]:
        """The headrooms a cell tries in turn: the given one, then (with `fit`) more."""
        if not self.fit:
            return (self.headroom,)
        steps = math.floor((FIT_MAX - self.headroom) / FIT_STEP + 1e-9)
        return tuple(round(self.headroom + i * FIT_STEP, 4) for i in range(max(steps, 0) + 1))

    def cells(self) -> Iterator[tuple[str, str, str, str]]:
        for model in self.models:
            for ratio in self.ratios:
                for strategy in self.plan_names:
                    for solver in self.solvers:
                        yield model, ratio, strategy, solver


def sweep_layout(models: tuple[str, ...], options: ModelOptions, *, device: str,
                 gpu: str | None = None, profiles_dir: str | None = None) -> ModelOptions:
    """The model options of a sweep given neither --channels-last nor --no-channels-last: in
    GPU mode channels-last when `optimize` would store every model of it that has
    convolutions so (`api.default_layout`), else as given. A model that does not load is left
    to fail in its own rows, which also say what their costs lack."""
    if device != "cuda":
        return options
    cnns = 0
    for model in models:
        try:
            graph = load_graph(model, options)
            if not has_convolutions(graph):
                continue
            with held_logs():
                costs = api.load_costs(graph, device=device, profiles_dir=profiles_dir, gpu=gpu)
                graph, _ = api.default_layout(graph, costs, profiles_dir=profiles_dir, gpu=gpu)
        except AutoTMError:
            continue
        if not is_channels_last(graph):
            return options
        cnns += 1
    return replace(options, channels_last=True) if cnns else options


def gpu_slug(name: str) -> str:
    """How a row's options name the GPU of `--gpu` ("NVIDIA H200" and "h200": h200)."""
    return Fingerprint("cuda", name, torch="").slug


def plan_stem(key: tuple[str, ...]) -> str:
    """The file name (without headroom and suffix) that `--plans` gives the plan of a row whose
    key (`row_key`, cell texts) this is."""
    return "_".join(k.replace(":", "-").replace("/", "-").replace("=", "-").replace(",", "-")
                    for k in key if k)


def cell_text(value: Any) -> str:
    """How a value reads back from CSV: the key of a row compares these strings."""
    if value is None:
        return ""
    if isinstance(value, float) and math.isnan(value):
        return ""
    return str(value)
