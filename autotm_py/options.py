"""Two frozen values that every layer passes whole: how a model is built, how a plan runs.

- `ModelOptions`: what rebuilds a graph from its model file or zoo name (batch, dims,
  training, optimizer, loss, loss chunks, layout, fusion). The CLI builds it once from its
  flags (or takes it from a plan's header), `pipeline.load_graph` builds the graph from it, and
  every plan records the one its graph was built with (`PlanHeader.model`).
- `RunMode`: how a plan runs on the device and was priced for: torch's caching allocator or
  one arena at planned addresses (`arena`), kernels allocating their outputs at their slots
  (`placed`, the placed allocator), where kernels' scratch lives (`scratch`: a window per
  kernel or one region), and CUDA-graph replay (`replay`). `PlanConfig.run` prices a plan for
  it, `PlanHeader.run` records it, the executor is composed from it
  (`runtime.execute.compose`).
- `Measure`: what a real run measures (iterations, warm-up, the cap, kernel times, ...).

`default_run_mode` and `default_precision` are the one place where what a plan defaults to on
a device is decided (`ModelOptions.on` resolves --precision auto with it). `check_run` is the
one place where a run mode and its measurement are checked against the
device they run on; `RunMode` checks itself when made.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from autotm_py.errors import ConfigError

SCRATCH_MODES: tuple[str, ...] = ("auto", "region", "windows")
OPTIMIZERS: tuple[str, ...] = ("sgd", "adam")
# --precision: fp32, or bf16 as torch.autocast runs it (`ir.precision`, docs/precision.md)
PRECISIONS: tuple[str, ...] = ("fp32", "bf16")
# "auto": the device's precision (`default_precision`), resolved where the device is known
AUTO_PRECISION = "auto"
PRECISION_CHOICES: tuple[str, ...] = (*PRECISIONS, AUTO_PRECISION)
PRECISION_KEY = "precision"  # graph.meta's key of a converted graph's precision
# graph.meta's layout key and value (`ir.layout` sets them; read here from the meta alone)
LAYOUT_KEY, CHANNELS_LAST = "layout", "channels-last"


# graph.meta's key of the fused convolution backward kernels a split graph split, by name
# (`ir.conv_split` sets it; read here from the meta alone)
SPLIT_KEY = "conv_grad_split"
# graph.meta's key of the optimizer updates a graph leaves to the host (`ir.host_updates` sets
# it; read here from the meta alone)
HOST_UPDATES_KEY = "host_updates"
# graph.meta's key of the share of the parameters the host updates in a split graph
HOST_SHARE_KEY = "host_share"
# graph.meta's key of a graph whose optimizer updates run as early as their gradients allow
# (`ir.update_order` sets it; read here from the meta alone)
UPDATES_EARLY_KEY = "updates_early"
OPTIMIZER_PLACES: tuple[str, ...] = ("gpu", "host", "split")  # --optimizer-on

# TensorGraph.meta key of the model a graph was loaded from (an ONNX file's absolute path or a
# zoo name; `pipeline.load_graph` sets it, plans record it as `PlanHeader.source`)
SOURCE_META_KEY = "model_source"


@dataclass(frozen=True)
class ModelOptions:
    """How a graph is built from its model file or zoo name (`--batch`, `--dim`, `--training`,
    `--optimizer`, `--no-fuse`, `--loss`, `--loss-chunks`, `--channels-last`, `--precision`).
    `optimizer` and `loss` are None where a graph has none (inference); loading takes sgd and
    auto then."""

    batch: int | None = None
    dims: Mapping[str, int] = field(default_factory=dict)
    training: bool = False
    optimizer: str | None = None  # the weight update of a training graph
    fuse: bool = True  # attention, GELU, Linear, convolution + ReLU fused (docs/fusion.md)
    loss: str | None = None  # the --loss rule of a training graph
    loss_chunks: int = 1  # --loss-chunks: blocks of the chunked loss (1: the plain loss)
    channels_last: bool = False  # --channels-last: images stored N, H, W, C (`ir.layout`)
    # --precision: fp32, or bf16 autocast (`ir.precision`); "auto" until resolved for a device
    # (`on`); a graph is built resolved (the default here, without a device, is fp32)
    precision: str = "fp32"
    # the fused convolution backward kernels split into their parts, by name
    # (`ir.conv_split`): the planner's `--split-conv-grads`, recorded so a plan rebuilds them
    split_conv_grads: tuple[str, ...] = ()
    # --optimizer-on host: every optimizer update runs on the host (`ir.host_updates`); the
    # graph is the GPU's part
    host_updates: bool = False
    # --optimizer-on split --host-share F: with host_updates, the host updates about this
    # share of the parameters and the GPU the rest (None: the host all of them)
    host_share: float | None = None
    # the optimizer updates moved to just after their gradients (`ir.update_order`): the
    # planner's `update_order`, recorded so a plan rebuilds that order
    updates_early: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "split_conv_grads", tuple(self.split_conv_grads or ()))
        if self.batch is not None and self.batch <= 0:
            raise ConfigError(f"--batch {self.batch}: must be a positive integer")
        bad = [f"{k}={v}" for k, v in dict(self.dims or {}).items() if int(v) <= 0]
        if bad:
            raise ConfigError(f"--dim {bad[0]}: expected a positive integer, e.g. --dim "
                              "batch=32")
        if self.optimizer is not None and self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"optimizer {self.optimizer!r}: choose one of "
                              f"{', '.join(OPTIMIZERS)}")
        if self.loss_chunks < 1:
            raise ConfigError(f"--loss-chunks {self.loss_chunks}: must be >= 1")
        if self.host_share is not None and not (self.host_updates and
                                                0 < self.host_share < 1):
            raise ConfigError(f"--host-share {self.host_share}: a fraction between 0 and 1 "
                              "(exclusive), with --optimizer-on split")
        if self.precision not in PRECISION_CHOICES:
            raise ConfigError(f"--precision {self.precision!r}: choose one of "
                              f"{', '.join(PRECISION_CHOICES)}")

    @classmethod
    def of_graph(cls, graph: Any) -> ModelOptions:
        """The options a graph was built with, read from its `meta`."""
        meta = graph.meta
        training = meta.get("training")
        return cls(batch=meta.get("batch"), dims=dict(meta.get("dims") or {}),
                   training=training is not None,
                   optimizer=None if training is None else training.get("optimizer"),
                   fuse="fusion" in meta,
                   loss=None if training is None else training.get("loss_rule", "auto"),
                   loss_chunks=1 if training is None else int(training.get("loss_chunks", 1)),
                   channels_last=meta.get(LAYOUT_KEY) == CHANNELS_LAST,
                   precision=str(meta.get(PRECISION_KEY, "fp32")),
                   split_conv_grads=tuple(meta.get(SPLIT_KEY) or ()),
                   host_updates=bool(meta.get(HOST_UPDATES_KEY)),
                   host_share=meta.get(HOST_SHARE_KEY),
                   updates_early=bool(meta.get(UPDATES_EARLY_KEY)))

    def differences(self, other: ModelOptions) -> list[str]:
        """In words, the options where `other` differs from this one."""
        out = []
        for name in ("batch", "dims", "training", "optimizer", "fuse", "loss", "loss_chunks",
                     "channels_last", "precision", "split_conv_grads", "host_updates",
                     "host_share", "updates_early"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if dict(mine or {}) != dict(theirs or {}) if name == "dims" else mine != theirs:
                out.append(f"{name} {theirs!r} (the plan's: {mine!r})")
        return out

    def filled_from(self, recorded: ModelOptions | None, given: frozenset[str]) -> ModelOptions:
        """These options with the ones not in `given` taken from `recorded` (a plan's): what
        `simulate`, `run` and `report` rebuild. --batch and --dim go together: given neither,
        both come from the plan."""
        if recorded is None:
            return self
        values = {name: getattr(recorded, name) for name in ModelOptions.__dataclass_fields__
                  if name not in given}
        if {"batch", "dims"} & given:
            values.pop("batch", None)
            values.pop("dims", None)
        return ModelOptions(**{**asdict(self), **values})

    def on(self, device: str) -> ModelOptions:
        """These options for a graph planned or run on `device`: precision "auto" resolved
        (`default_precision`), the others as they are."""
        if self.precision != AUTO_PRECISION:
            return self
        return ModelOptions(**{**asdict(self), "precision": default_precision(device)})

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "dims": dict(self.dims or {}),
                "split_conv_grads": list(self.split_conv_grads)}


@dataclass(frozen=True)
class RunMode:
    """How a plan runs on the device (and is priced for). Host mode ignores all of it.

    `arena`: every fast copy at a planned offset in one arena (`autotm_py.arena` packs it),
    else torch's caching allocator; `placed` (with `arena`, on CUDA): kernels without an
    `out=` form allocate their outputs at their slots (`runtime.placed`), else those are
    copied there; `scratch` (with `arena` and `placed`): "windows", each kernel's scratch in a
    window of the arena live only while it runs, or "region", one region beside the arena for
    the whole iteration ("auto": windows where possible); `replay` (CUDA): one iteration
    captured as a CUDA graph and replayed."""

    arena: bool = False
    placed: bool = True
    scratch: str = "auto"
    replay: bool = False

    def __post_init__(self) -> None:
        if self.scratch not in SCRATCH_MODES:
            raise ConfigError(f"--scratch {self.scratch!r}: choose one of "
                              f"{', '.join(SCRATCH_MODES)}")
        if self.scratch == "windows" and not (self.arena and self.placed):
            raise ConfigError("--scratch windows needs --arena and --placed (the placed "
                              "allocator serves the windows; both are the GPU default): drop "
                              "--no-arena or --no-placed, or --scratch")

    @property
    def places_outputs(self) -> bool:
        """Kernels allocate their outputs at their arena slots (an arena and `placed`)."""
        return self.arena and self.placed

    @property
    def scratch_mode(self) -> str:
        """Where kernels' scratch lives in effect: windows or region (auto: windows with an
        arena and the placed allocator, which measured up to 1.38x faster than the region and
        never more than 2.1% slower on the benchmark's models:
        experiments/journal/gpu-2026-11.md)."""
        if self.scratch != "auto":
            return self.scratch
        return "windows" if self.places_outputs else "region"

    @property
    def windows(self) -> bool:
        return self.scratch_mode == "windows"

    def resolved(self) -> RunMode:
        """The mode with `scratch` in effect (what a plan header records)."""
        return RunMode(self.arena, self.placed, self.scratch_mode, self.replay)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunMode:
        return cls(bool(data.get("arena", False)), bool(data.get("placed", True)),
                   str(data.get("scratch", "auto")), bool(data.get("replay", False)))

    def on(self, device: str) -> RunMode:
        """This mode as it can run on `device`: off CUDA without the replay (CUDA graphs are
        CUDA's); the arena runs anywhere (the placed allocator is installed on CUDA only)."""
        if str(device).startswith("cuda") or not self.replay:
            return self
        return RunMode(self.arena, self.placed, self.scratch, replay=False)


# How a plan runs unless told otherwise, per device (`default_run_mode`): on a GPU the way the
# benchmark's fastest plans ran (docs/results.md): one arena at planned addresses, kernels
# allocating their outputs at their slots, scratch windows, replayed as a CUDA graph. Host mode
# (and a run on the CPU) has neither CUDA graphs nor the placed allocator: eager, on torch's
# allocator (the machine model ignores the run mode there).
GPU_RUN_MODE = RunMode(arena=True, placed=True, scratch="auto", replay=True)
HOST_RUN_MODE = RunMode()


def default_run_mode(device: str) -> RunMode:
    """The run mode plans are made for and run in on `device` (cuda, cuda:N or cpu) unless
    told otherwise: `optimize`, `bench`, `train` and `PlanConfig` alike."""
    return GPU_RUN_MODE if str(device).startswith("cuda") else HOST_RUN_MODE


# The precision a GPU plans, runs and trains in unless told otherwise (`default_precision`):
# bf16, as PyTorch users train on Hopper GPUs (issue 46). Flipped on 2026-12-04 once bf16
# profiles shipped for the H200 (no H100 is lent to measure its own) and the README's quick
# start, ResNet-50 training at 1:4, planned within 1.5x of fp32's time: 16.0 s in bf16 against
# 11.6 s in fp32 on the 2-core machine (medians of 3 runs), both optimal, each packing its
# arena at the first solve (it was 35.5 s against 18.2 s on 2026-12-03, when the bf16
# packing missed by 2 MB and the fit loop solved again). `--precision fp32` /
# `precision="fp32"` keep the fp32 plan.
GPU_DEFAULT_PRECISION = "bf16"


def default_precision(device: str, bf16: bool = True) -> str:
    """The precision a graph is planned and run in on `device` (cuda, cuda:N or cpu) unless
    told otherwise (--precision auto, `Trainer(precision="auto")`): on a GPU
    `GPU_DEFAULT_PRECISION` (where `bf16`: the GPU has bf16 arithmetic, which the Trainer asks
    torch; planning for a GPU assumes it), fp32 on the CPU and in host mode
    (docs/precision.md)."""
    return GPU_DEFAULT_PRECISION if str(device).startswith("cuda") and bf16 else "fp32"


# The cap on the device's allocator is the budget and this much for library workspaces.
CAP_SLACK_BYTES = 64 << 20
# The CUDA caching allocator's settings for runs (`runtime.device.configure_cuda`; None: the
# environment's). Expandable segments let the allocator unmap free pages when it meets the cap
# (less fragmentation, though plans still need `--headroom`: docs/gpu.md).
DEFAULT_ALLOCATOR_SETTINGS = "expandable_segments:True"


@dataclass(frozen=True)
class Measure:
    """What a real run measures: `iterations` timed after `warmup` untimed ones; `capped`:
    the device's allocator held to the plan's budget + `cap_slack_bytes`; `kernel_times`: an
    event after each kernel (eager only), `per_iteration_kernel_times` every iteration's;
    `device_busy` (CUDA): one more iteration profiled for the GPU's busy time; `seed`: the
    random values where no real ones are given; `deterministic`: deterministic algorithms."""

    iterations: int = 5
    warmup: int = 2
    seed: int = 0
    capped: bool = True
    cap_slack_bytes: int = CAP_SLACK_BYTES
    kernel_times: bool = False
    per_iteration_kernel_times: bool = False
    device_busy: bool = False
    deterministic: bool = False
    allocator_settings: str | None = DEFAULT_ALLOCATOR_SETTINGS

    def __post_init__(self) -> None:
        if self.iterations < 1 or self.warmup < 0:
            raise ConfigError("--iterations must be >= 1 and --warmup >= 0")


def check_run(device: str, mode: RunMode, measure: Measure | None = None) -> None:
    """The one check of what a run may combine: replay and the busy-time profile need CUDA,
    and neither goes with per-kernel events (which split the iteration)."""
    measure = measure or Measure(iterations=1, warmup=0)
    cuda = str(device).startswith("cuda")
    if mode.replay and (not cuda or measure.kernel_times):
        raise ConfigError("--replay captures and replays a CUDA graph: it needs --device cuda, "
                          "and it does not time single kernels (no --kernel-times)")
    if measure.device_busy and (not cuda or measure.kernel_times):
        raise ConfigError("--device-busy profiles what the GPU does: it needs --device cuda, "
                          "and not --kernel-times (whose events split the iteration)")
