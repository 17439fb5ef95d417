"""`PlanConfig`: every planning option in one frozen object, built by the CLI or an API caller."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from autotm_py.errors import ConfigError
from autotm_py.options import RunMode, default_run_mode
from autotm_py.units import Ratio, parse_bytes, parse_ratio

Strategy = Literal["static", "sync", "async"]
# A strategy is how a plan schedules its copies (docs/planning.md, "Strategies"): static, one
# tier per tensor for life; sync, blocking copies around uses; async, also copies overlapped with
# nearby kernels. It means the same in `optimize --strategy`, `bench --strategies`, the Trainer's
# `strategy` and `PlanConfig.strategy`: whether the plan may also recompute is `--recompute`'s
# (`RECOMPUTE_MODES`; auto: on in GPU mode). The plan names (`PLAN_NAMES`: `sync+recompute`,
# `recompute-only`, ...) are accepted wherever a strategy is, and fix the recompute mode too.
STRATEGIES: tuple[str, ...] = ("static", "sync", "async")
# async: the benchmark's fastest plans on a GPU (with recompute, an arena and replay:
# `options.default_run_mode`), and never slower than sync in host mode (docs/planning.md,
# section 12); the static -> sync -> async chain solves it from the sync plan.
DEFAULT_STRATEGY = "async"
DEFAULT_SOLVER = "highs"
DEFAULT_GAP = 0.01
# Seconds the whole static -> sync -> async chain may search before the best plan found is
# returned, marked `time_limit` (None: no limit). HiGHS plans every zoo model in GPU mode at
# 1:4 within it (docs/planning.md, section 12).
DEFAULT_TIME_LIMIT_S = 300.0
# A plan packed into an arena may be solved again (`fitting.fit_arena`, the default on a GPU):
# the re-solves share the time limit of the first, each getting what is left of it and at least
# this share of it (`PlanConfig.time_left`), so that a search that used its whole limit is not
# repeated whole up to 4 times.
RESOLVE_MIN_SHARE = 0.25
DEFAULT_ASYNC_WINDOW = 15
# async: how many kernels of each window are decision points (the longest ones); None: all
DEFAULT_ASYNC_CANDIDATES = 4
# Which memory system a device plans for unless --memory says otherwise.
DEFAULT_MEMORY = {"cuda": "h100-pcie5", "cpu": "optane"}
# The link a plan priced for a GPU (`--gpu NAME`) crosses unless --memory says otherwise: the preset
# calibrated on that GPU (`memory/tiers.py`). Copies are priced with the link of the GPU that runs
# them, as kernels are with its profiles: the H200's overlapped copies run 7% faster than the H100's
# (experiments/journal/gpu-2026-11.md, "The H200's own link"). A GPU with profiles but no preset
# here keeps DEFAULT_MEMORY["cuda"]: `autotm calibrate` on it, then --memory FILE.
GPU_MEMORY = {"NVIDIA H100 80GB HBM3": "h100-pcie5", "NVIDIA H200": "h200-pcie5"}
# The memory of the GPUs with profiles, rounded up to whole GiB (80 GB and 141 GB cards): a
# budget above it cannot be held on that GPU, and a plan for it says so
GPU_DEVICE_BYTES = {"NVIDIA H100 80GB HBM3": 80 << 30, "NVIDIA H200": 141 << 30}
MAX_HEADROOM = 0.5
# Recomputation (docs/planning.md section 2b): off = move-only (AutoTM's plans), on = keep,
# move or recompute (the joint ILP), only = keep or recompute, nothing is copied between tiers;
# auto = on in GPU mode (where moving over PCIe is slow and compute is fast), off in host mode.
RECOMPUTE_MODES: tuple[str, ...] = ("auto", "off", "on", "only")
DEFAULT_RECOMPUTE_DEPTH = 2  # regeneration chains: a regenerated input of a regeneration, ...
# A forward kernel is a recompute candidate when its time is at most this times the time to
# copy its outputs out and back (both directions, overlapped copies)
DEFAULT_RECOMPUTE_RATIO = 1.0
# Regeneration points up to this many backward kernels before a tensor's first backward use, so
# that chains are re-made link by link as checkpointing re-runs a segment; the search keeps them
# only where its checkpoint-style start pays (`planning.solve.EARLY_MIN_GAIN`). 32 measured
# best on ResNet-200 and DenseNet-264 (docs/planning.md, "Early points"); 0 turns them off.
DEFAULT_RECOMPUTE_EARLY = 32
# Where the ILP prices an async read (docs/planning.md, "Pricing reads where they join"): step
# = against the one kernel it is issued beside (AutoTM's step join; the objective is then an
# upper bound of the simulated timeline); spread = over the kernels until the tensor's next
# use, where the executor joins it. Step stays the default: of five H100 benchmark cells spread
# sped up one (ResNet-200 at 25%: 4.3% measured) and no other, with a larger ILP
# (experiments/journal/gpu-2026-11.md).
READ_PRICINGS: tuple[str, ...] = ("step", "spread")
# Where the ILP prices an async write (docs/planning.md, "Pricing writes over their span"):
# step = against the kernel it is issued beside, its source's memory free after that step;
# spread = over the kernels after it until their time covers the copy, the source holding its
# memory as long (the executor frees it when the copy is done).
WRITE_PRICINGS: tuple[str, ...] = ("step", "spread")
# --split-conv-grads: when the planner splits fused convolution backward kernels (`PlanConfig`)
SPLIT_MODES: tuple[str, ...] = ("auto", "on", "off")
UPDATE_ORDERS: tuple[str, ...] = ("auto", "early", "end")  # --update-order
DEFAULT_READ_PRICING = "step"
DEFAULT_WRITE_PRICING = "step"
# The plan names of the three families, as headers, `autotm bench --strategies` and reports
# write them: "<strategy>" (move-only), "<strategy>+recompute" (joint), "recompute-only".
RECOMPUTE_SUFFIX = "+recompute"
RECOMPUTE_ONLY = "recompute-only"
# The largest peak footprint the command line accepts: the most memory one machine has (an
# 8-socket server: 32 TiB of DRAM, far above 8 GPUs' HBM). Above it a model cannot run anywhere
# and a plan means nothing; it is almost always a typo in --batch or --dim.
MAX_FOOTPRINT_BYTES = 32 * 2**40


@dataclass(frozen=True)
class PlanConfig:
    """How to plan: strategy, budget (ratio or bytes), memory system, solver settings."""

    strategy: str = DEFAULT_STRATEGY  # a strategy or a plan name (`parse_strategy`)
    ratio: Ratio | None = None
    fast_mem_bytes: int | None = None
    device: str = "cuda"
    memory: str | None = None  # preset name or memory-system file; None: `default_memory`
    solver: str = DEFAULT_SOLVER
    gap: float = DEFAULT_GAP
    time_limit_s: float | None = DEFAULT_TIME_LIMIT_S
    async_window: int = DEFAULT_ASYNC_WINDOW
    async_candidates: int | None = DEFAULT_ASYNC_CANDIDATES
    pin_weights: bool = False
    threads: int | None = None
    # Share of the budget the plan leaves free for the allocator's fragmentation (AutoTM's
    # "defrag" margin): the ILP bounds the sum of live bytes, a real heap needs more.
    headroom: float = 0.0
    recompute: str = "auto"  # auto | off | on | only (RECOMPUTE_MODES)
    recompute_depth: int = DEFAULT_RECOMPUTE_DEPTH
    recompute_ratio: float = DEFAULT_RECOMPUTE_RATIO
    # Regeneration also at this many backward kernels before a tensor's first backward use
    # (`recompute.recompute_spec`): chains regenerated link by link, as checkpointing does.
    recompute_early: int = DEFAULT_RECOMPUTE_EARLY
    read_pricing: str = DEFAULT_READ_PRICING  # READ_PRICINGS
    write_pricing: str = DEFAULT_WRITE_PRICING  # WRITE_PRICINGS
    # How the plan will run, and is priced for (`options.RunMode`): arena, placed outputs,
    # scratch windows or region, CUDA-graph replay. With `run.arena` (GPU mode) every
    # fast-memory buffer gets a planned offset in one arena and the packed arena fits the
    # budget, so that the plan runs without headroom; `run.replay` prices the iteration as a
    # CUDA graph replays it (device times, no host dispatch). None: the device's default
    # (`options.default_run_mode`: all of it on a GPU; host mode ignores the run mode).
    run: RunMode = None  # type: ignore[assignment]  # set in __post_init__
    # Fast memory the runtime keeps for itself (GPU: torch's cuBLAS workspaces), taken out of
    # the budget before the plan's tensors; None: the memory system's `runtime_reserve_bytes`.
    reserve_bytes: int | None = None
    # GPU mode: price with the profiles of this GPU (a name or a part of one: "h200"), not
    # the planning machine's (`profiling.load_costs`); the plan records which (`PlanHeader.gpu`).
    gpu: str | None = None
    # Facts from a value profile (`autotm profile --values`, docs/values.md): (tensor name,
    # value) of tensors found all zero or one constant. GPU mode: the planner may drop such a
    # tensor for free and fill it again before a use instead of copying it. (): no facts.
    fills: tuple[tuple[str, float], ...] = ()
    # Fused convolution backward kernels (ConvGrad: dY, X, W -> dX, dW) split into their
    # filter and data parts, recurrent layers and their gradient kernels into batch chunks
    # (`ir.conv_split`; docs/planning.md): "auto" where that makes an
    # infeasible budget feasible, "on" every one, "off" none (SPLIT_MODES). The plan is then
    # for the split graph (`PlanResult.graph`); "off" here, as the Trainer and the benchmark
    # run a plan on the graph they gave; `autotm optimize` defaults to "auto".
    split_conv_grads: str = "off"
    # Where a training graph's optimizer updates run (`ir.update_order`, docs/planning.md
    # section 2c): "end", after the whole backward pass, as torch.optim's step() runs them;
    # "early", in groups as soon as their gradients are final; "auto" (UPDATE_ORDERS):
    # early under a budget below the graph's peak, at the end otherwise. An early plan is for
    # the reordered graph (`PlanResult.graph`): "end" here, as the benchmark and API callers
    # run a plan on the graph they gave; `autotm optimize`, `autotm train` and the Trainer
    # default to "auto".
    update_order: str = "end"

    def __post_init__(self) -> None:
        self._coerce()
        self._check_choices()
        self._check_recompute()
        if self.ratio is not None and self.fast_mem_bytes is not None:
            raise ConfigError("give either --ratio or --fast-mem, not both")
        self._check_device()
        if not 0 <= self.headroom < MAX_HEADROOM:
            raise ConfigError(f"--headroom {self.headroom}: a share of the budget in "
                              f"[0, {MAX_HEADROOM}), e.g. 0.1 to leave 10% for fragmentation")
        if not 0 <= self.gap < 1:
            raise ConfigError(f"--gap {self.gap}: a relative gap in [0, 1), e.g. 0.01 for 1%")
        if self.time_limit_s is not None and self.time_limit_s <= 0:
            raise ConfigError(f"--time-limit {self.time_limit_s}: must be positive seconds")
        if self.async_window < 0:
            raise ConfigError(f"--async-window {self.async_window}: must be >= 0")
        if self.async_candidates is not None and self.async_candidates < 1:
            raise ConfigError(f"--async-candidates {self.async_candidates}: must be >= 1 "
                              "(or 'all')")
        if self.run is None:
            object.__setattr__(self, "run", default_run_mode(self.device))
        if not isinstance(self.run, RunMode):
            raise ConfigError(f"run {self.run!r}: give an autotm_py.options.RunMode")

    def _check_choices(self) -> None:
        """The options that take one of a few words, each named as its flag when it does not."""
        for flag, value, choices in (("--update-order", self.update_order, UPDATE_ORDERS),
                                     ("--split-conv-grads", self.split_conv_grads, SPLIT_MODES),
                                     ("--read-pricing", self.read_pricing, READ_PRICINGS),
                                     ("--write-pricing", self.write_pricing, WRITE_PRICINGS)):
            if value not in choices:
                raise ConfigError(f"{flag} {value!r}: choose one of {', '.join(choices)}")

    def _check_device(self) -> None:
        if self.device not in DEFAULT_MEMORY:
            raise ConfigError(f"--device {self.device!r}: choose cuda (GPU mode) or cpu (host "
                              "mode)")
        if self.gpu and self.device != "cuda":
            raise ConfigError(f"--gpu {self.gpu!r} picks a GPU's profiles: it needs --device "
                              "cuda")

    def _check_recompute(self) -> None:
        strategy, recompute = parse_strategy(self.strategy, self.recompute)
        object.__setattr__(self, "strategy", strategy)
        object.__setattr__(self, "recompute", recompute)
        if self.recompute not in RECOMPUTE_MODES:
            raise ConfigError(f"--recompute {self.recompute!r}: choose one of "
                              f"{', '.join(RECOMPUTE_MODES)}")
        if self.recompute in ("on", "only") and self.strategy == "static":
            raise ConfigError(f"--recompute {self.recompute} needs decision points at the uses "
                              "of each tensor: use --strategy sync or async")
        if self.recompute_depth < 1:
            raise ConfigError(f"--recompute-depth {self.recompute_depth}: must be >= 1")
        if not self.recompute_ratio > 0:
            raise ConfigError(f"--recompute-ratio {self.recompute_ratio}: must be positive")
        if self.recompute_early < 0:
            raise ConfigError(f"--recompute-early {self.recompute_early}: must be >= 0")

    @property
    def recompute_mode(self) -> str:
        """The recompute mode in effect: off, on or only (auto: on in GPU mode unless the
        strategy is static, else off; with an arena too, as the benchmark's best plans)."""
        if self.recompute != "auto":
            return self.recompute
        return "on" if self.device == "cuda" and self.strategy != "static" else "off"

    @property
    def plan_name(self) -> str:
        """The plan family's name: ``sync``/``async`` (move-only), ``sync+recompute``/
        ``async+recompute`` (joint) or ``recompute-only``."""
        mode = self.recompute_mode
        if mode == "only":
            return RECOMPUTE_ONLY
        return self.strategy + (RECOMPUTE_SUFFIX if mode == "on" else "")

    @classmethod
    def for_plan_name(cls, name: str, **kwargs: Any) -> PlanConfig:
        """The config of the plan family a plan's name says (`plan_name`, the plan header's
        `strategy`, a bench row's): a plan named ``async`` was planned move-only, whatever the
        device; ``async+recompute`` joint; ``recompute-only`` recompute-only. (A *strategy*
        given as an option, `PlanConfig(strategy=...)`, leaves recompute to `recompute`.)"""
        if name == RECOMPUTE_ONLY:
            return cls(strategy="sync", recompute="only", **kwargs)
        if name.endswith(RECOMPUTE_SUFFIX):
            return cls(strategy=name[:-len(RECOMPUTE_SUFFIX)], recompute="on", **kwargs)
        if name not in STRATEGIES:
            raise ConfigError(f"--strategy {name!r}: choose one of {', '.join(PLAN_NAMES)}")
        return cls(strategy=name, recompute="off", **kwargs)

    def _coerce(self) -> None:
        """API callers may write ratio="1:4" and fast_mem_bytes="16GiB", as on the command
        line; anything else that is not a `Ratio` is refused here, not deep in planning."""
        if isinstance(self.ratio, str):
            object.__setattr__(self, "ratio", parse_ratio(self.ratio, flag="ratio"))
        elif self.ratio is not None and not isinstance(self.ratio, Ratio):
            raise ConfigError(f"ratio {self.ratio!r}: give a string like '1:4' or "
                              "autotm_py.units.parse_ratio('1:4')")
        if isinstance(self.fast_mem_bytes, str):
            object.__setattr__(self, "fast_mem_bytes",
                               parse_bytes(self.fast_mem_bytes, flag="fast_mem_bytes"))
        if self.reserve_bytes is not None and self.reserve_bytes < 0:
            raise ConfigError(f"--reserve {self.reserve_bytes}: must be >= 0 bytes")

    @property
    def memory_name(self) -> str:
        return self.memory or default_memory(self.device, self.gpu)

    def time_left(self, spent_s: float) -> PlanConfig:
        """This config for a solve after `spent_s` seconds of its time limit were spent: what
        is left of it, at least `RESOLVE_MIN_SHARE` of it (no limit: none)."""
        if self.time_limit_s is None:
            return self
        return replace(self, time_limit_s=max(self.time_limit_s - spent_s,
                                              RESOLVE_MIN_SHARE * self.time_limit_s))

    def with_ratio(self, text: str) -> PlanConfig:
        return replace(self, ratio=parse_ratio(text), fast_mem_bytes=None)

    def in_bytes(self, budget_bytes: int | None) -> PlanConfig:
        """This config with its budget given in bytes (a ratio resolved against the graph as
        the user gave it, before it was rewritten: split, reordered or planned elsewhere)."""
        return replace(self, ratio=None, fast_mem_bytes=budget_bytes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ratio"] = None if self.ratio is None else str(self.ratio)
        d["recompute"] = self.recompute_mode
        d["run"] = self.run.resolved().to_dict()
        return d


def gpus_named(name: str, known: Iterable[str]) -> list[str]:
    """The GPUs among `known` that `--gpu NAME` may mean: the one whose name equals NAME, else
    every one whose name contains it ("h200" for "NVIDIA H200"), ignoring case."""
    names = sorted(set(known))
    wanted = name.strip().lower()
    exact = [n for n in names if n.lower() == wanted]
    return exact or [n for n in names if wanted and wanted in n.lower()]


def default_memory(device: str, gpu: str | None = None) -> str:
    """The memory system a plan uses when --memory is not given: that of the one GPU `gpu`
    names in `GPU_MEMORY`, else the device's default."""
    named = gpus_named(gpu, GPU_MEMORY) if device == "cuda" and gpu else []
    return GPU_MEMORY[named[0]] if len(named) == 1 else DEFAULT_MEMORY[device]


PLAN_NAMES: tuple[str, ...] = (*STRATEGIES, *(s + RECOMPUTE_SUFFIX for s in STRATEGIES[1:]),
                               RECOMPUTE_ONLY)


def parse_strategy(name: str, recompute: str = "auto") -> tuple[str, str]:
    """(strategy, recompute mode) that a strategy name given with `--recompute recompute`
    means, the same in every command: ``static``, ``sync``, ``async`` are the copy schedule,
    with `recompute` as given (auto: on in GPU mode, off in host mode); ``sync+recompute``,
    ``async+recompute`` and ``recompute-only`` also fix the recompute mode (on, only), so
    another explicit one is refused."""
    if name in STRATEGIES:
        return name, recompute
    if name == RECOMPUTE_ONLY:
        fixed = ("sync", "only")
    elif name.endswith(RECOMPUTE_SUFFIX) and name[:-len(RECOMPUTE_SUFFIX)] in STRATEGIES[1:]:
        fixed = (name[:-len(RECOMPUTE_SUFFIX)], "on")
    else:
        raise ConfigError(f"--strategy {name!r}: choose one of {', '.join(PLAN_NAMES)}")
    if recompute not in ("auto", fixed[1]):
        raise ConfigError(f"--strategy {name} means --recompute {fixed[1]}: drop --recompute "
                          f"{recompute}, or give --strategy {fixed[0]} --recompute {recompute}")
    return fixed

