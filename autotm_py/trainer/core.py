"""`Trainer`: a user's torch module and optimizer, trained under a memory plan.

    trainer = Trainer(model, opt, loss_fn=F.cross_entropy, example=(x, y), budget="4GiB")
    for x, y in loader:
        loss = trainer.step(x, y)       # one planned iteration on this batch
    trainer.sync()                      # trained values back into model and opt

Construction captures the module's forward at the example batch (`frontend.capture`: the
dynamo ONNX exporter, its initializers named after the module's parameters), imports it,
derives one training iteration with the optimizer's update and the loss the loss function
computes (`trainer.spec`), prices it (on a GPU, the kernels no profile has are measured first,
once, into the profile cache), and plans it under the budget (a plan is kept on disk under a
key of graph, options and costs: `pipeline.cached_optimize`, so a second Trainer of the same
model and budget starts at once). Each `step` places the batch, the learning rate of
`param_groups[0]` and the carried state where the plan starts them, and runs the plan's
iteration with the executor (`runtime.execute.compose`); on a GPU the default run mode is the
fastest one measured (an arena at planned addresses, kernels allocating their outputs at
their slots, replayed as a CUDA graph after two eager steps). `sync` writes the parameters,
BatchNorm's running statistics and the optimizer's state back (the Trainer owns the
up-to-date values between syncs).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import fields as dataclass_fields
from typing import Any

import torch

from autotm_py import pipeline
from autotm_py.config import PlanConfig
from autotm_py.errors import ConfigError
from autotm_py.frontend.capture import capture_module
from autotm_py.frontend.onnx import import_model
from autotm_py.ir.host_updates import offload_updates, offloaded_updates, update_bytes
from autotm_py.ir.layout import has_convolutions, to_channels_last
from autotm_py.ir.precision import with_precision
from autotm_py.ir.training import chunkable_logits_bytes, derive_training
from autotm_py.options import AUTO_PRECISION, OPTIMIZER_PLACES, RunMode
from autotm_py.runtime.device import check_budget_room
from autotm_py.runtime.pinned import (
    SLOW_TIER_FIX,
    check_host_fits,
    pinned_footprint,
    slow_tier_layout,
)
from autotm_py.trainer.host import HostSide, RunMasters
from autotm_py.trainer.loop import Loop, default_mode, gpu_name, plan_for, precision_on
from autotm_py.trainer.spec import Example, loss_rule, optimizer_of, split_example
from autotm_py.trainer.state import Masters, StateMap
from autotm_py.units import format_bytes, parse_bytes, parse_ratio

# where a Trainer's optimizer updates may run (`optimizer_on`): the command line's places, or
# the planner's choice
PLACES = (*OPTIMIZER_PLACES, "auto")


class Trainer:
    """Train `module` with `optimizer` under a fast-memory budget (`budget` bytes or "4GiB",
    or `ratio` "1:3": the fast tier holds a quarter of one iteration's peak). `device`:
    "cuda" (default where there is one) or "cpu" (the same plan, run on the CPU: a check of
    its numbers, both tiers in host memory). `mode`: how the plan runs (`options.RunMode`,
    default the fastest for the device). `strategy`, `recompute`, `gpu`, `time_limit_s`:
    as `autotm optimize`. `plans_dir`: where plans are kept (default beside the profile
    cache). `channels_last`: store convolution images N, H, W, C (default: on a GPU for
    models with convolutions). `profile`: measure the kernels no profile has first (default
    on a GPU). `loss_chunks` > 1: a language model's output layer and its cross-entropy as
    one kernel over that many blocks of tokens, so the logits never exist whole (as
    `--loss-chunks`; the loss function must be a cross-entropy over the last axis); 1: the
    plain loss; "auto" (default): `AUTO_LOSS_CHUNKS` on a GPU where the loss can be chunked
    and its logits are at least `AUTO_CHUNK_SHARE` of the iteration's peak (in fp32 only
    under a budget below that peak), else 1 (`auto_loss_chunks`; docs/training-loop.md says
    why).
    `precision`: "fp32", "bf16" (the step as `torch.autocast("cuda", torch.bfloat16)` runs
    it, with fp32 weights and optimizer state: docs/precision.md) or "auto" (default): the
    device's (`options.default_precision`: bf16 on a GPU with bf16 arithmetic, else
    fp32). `optimizer_on`: where the optimizer's updates run: "gpu" (on the weights, gradients
    and optimizer state the plan places), "host" (on the host's cores, overlapping the GPU's
    backward pass: `trainer.host`; the GPU streams only the weights its kernels read and their
    gradients; the module's parameters become views of the host's masters until `close`),
    "split" (the host the weights whose gradients come first, the GPU those that come last:
    `host_share` of the parameters on the host, or by default the share the host's plan is
    predicted to finish within the GPU's iteration) or "auto" (default): on the GPU unless the
    weights, gradients and optimizer state alone exceed the budget, then whichever of the
    three plans is predicted fastest (`notes` says which and their times). `plan_options`:
    more of `PlanConfig`'s fields, as `autotm optimize`'s advanced options set them (e.g.
    {"write_pricing": "spread", "read_pricing": "spread", "async_window": 60}); the ones the
    arguments above set are refused."""

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 loss_fn: Callable[..., Any], example: Any, *, budget: int | str | None = None,
                 ratio: str | None = None, device: str | None = None,
                 mode: RunMode | None = None, strategy: str = "async", recompute: str = "on",
                 gpu: str | None = None, time_limit_s: float | None = 300.0,
                 plans_dir: str | os.PathLike[str] | None = None,
                 channels_last: bool | None = None, profile: bool | None = None,
                 loss_chunks: int | str = "auto", precision: str = AUTO_PRECISION,
                 optimizer_on: str = "auto", host_share: float | None = None,
                 plan_options: Mapping[str, Any] | None = None) -> None:
        if optimizer_on not in PLACES:
            raise ConfigError(f"Trainer: optimizer_on={optimizer_on!r}: choose one of "
                              f"{', '.join(PLACES)}")
        host_share = _share_option(host_share, optimizer_on)  # before the capture's minutes
        more = _plan_options(plan_options)
        if (budget is None) == (ratio is None):
            raise ConfigError("Trainer: give either budget (bytes, e.g. '4GiB') or ratio "
                              "(fast:slow, e.g. '1:3'), not both and not neither")
        self.module, self.optimizer = module, optimizer
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        cuda = self.device.startswith("cuda")
        self.mode = mode or default_mode(self.device)
        # before anything uses CUDA in this process (the export may, as do naming the GPU
        # and profiling): one work queue for replays, the placed allocator for arena runs (its
        # region the device's free memory: the Trainer's own plan keeps within the budget)
        self.notes: list[str] = pipeline.prepare_cuda(self.device, self.mode, None)
        if isinstance(budget, str):  # read once, here, so a bad one is named as this argument
            budget = parse_bytes(budget, flag="Trainer: budget")
        # before the capture's minutes (a ratio: once it is resolved, in `plan_for`)
        check_budget_room(budget, self.device, "Trainer")
        self.example = split_example(example)
        self.precision = precision_on(precision, self.device)
        self.graph, captured = self._capture(loss_fn, channels_last, loss_chunks,
                                             self.precision, _budget_of(budget, ratio))
        self.map = StateMap.of(self.graph, captured, module)
        del captured  # the exported file, the module's weights again: no longer read
        # GPU mode on either device: kernels read fast memory, copies cross the link. On the
        # CPU nothing keeps fast memory for itself (the GPU presets reserve cuBLAS's).
        config = PlanConfig(strategy=strategy, ratio=ratio, fast_mem_bytes=budget,
                            device="cuda", recompute=recompute, run=self.mode,
                            gpu=gpu or gpu_name(self.device),
                            reserve_bytes=None if cuda else 0, time_limit_s=time_limit_s,
                            **{"split_conv_grads": "auto", "update_order": "auto", **more})
        # what the GPU runs: the training graph, or its part without the optimizer's updates
        self.optimizer_on, self.run_graph, self.plan = self._plan_updates(
            config, optimizer_on, plans_dir, cuda if profile is None else profile, host_share)
        self._ids = _run_ids(self.graph, self.run_graph)
        masters: Any = Masters(self.graph, self.map, optimizer)
        self.host: HostSide | None = None
        if self.optimizer_on != "gpu":
            self.host = HostSide(self.graph, self.run_graph, self.map, optimizer, self._spec)
            masters = RunMasters(self.run_graph, masters, frozenset(self.host.fed))
        masters.update(self._batch_masters(self.example))
        self.host_bytes = self._check_host_memory()
        self.loop = Loop(self.run_graph, self.plan, self.device, self.mode, masters)
        self.notes += self.loop.notes  # the plan's: another GPU's profiles, no arena, a split
        if self.host is not None:  # the GPU reads the host's slow-tier copies as they are
            masters.fed = {t: self.host.slot(self.loop.executor, t) for t in self.host.fed}
            self.host.attach(self.loop.executor)
        self._synced = 0

    def _plan_updates(self, config: PlanConfig, optimizer_on: str, plans_dir: Any,
                      measure: bool, host_share: float | None) -> tuple[str, Any, Any]:
        """Where the optimizer's updates run, the graph the GPU runs, and its plan. "auto":
        on the GPU, unless the weights, gradients and optimizer state alone exceed the
        budget; then the three places are planned and the one predicted fastest kept (said in
        `notes`). "split" plans the host's first: its cut comes from that plan. A ratio is of
        the training graph's peak wherever the updates run."""
        state = update_bytes(self.graph)
        budget = pipeline.user_budget(self.graph, config)
        places = {"auto": ["gpu", "host", "split"] if budget is not None and state > budget
                  else ["gpu"],
                  # a given share needs no host plan to cut from
                  "split": ["host", "split"] if host_share is None else ["split"],
                  }.get(optimizer_on, [optimizer_on])
        if places != ["gpu"] and budget is not None:
            config = config.in_bytes(budget)
        plans: dict[str, tuple[Any, Any]] = {}
        failed: dict[str, ConfigError] = {}
        for place in places:
            if place == "split" and host_share is None and "host" not in plans:
                continue  # its cut comes from the host's plan
            try:
                graph = self._run_graph(place, plans, config, host_share)
                if place == "split" and not graph.meta["training"]["weight_grads"]:
                    if "host" in plans:  # the GPU would keep no update: the host's plan
                        continue
                    place = "host"
                plans[place] = plan_for(graph, config, self.device, plans_dir=plans_dir,
                                        measure=measure, face="trainer")
            except ConfigError as exc:
                failed[place] = exc
        if not plans:  # the host's reason where it was tried: it needs the least memory
            raise ConfigError(f"Trainer: {failed.get('host') or next(iter(failed.values()))}")
        place = min(plans, key=lambda p: plans[p][1].header.predicted_time_s or math.inf)
        if optimizer_on == "split":
            place = "split" if "split" in plans else "host"
        self.notes += self._place_notes(optimizer_on, place, places, plans, failed, state)
        return place, *plans[place]

    def _run_graph(self, place: str, plans: dict[str, tuple[Any, Any]], config: PlanConfig,
                   host_share: float | None) -> Any:
        """The graph the GPU runs with the updates at `place`. A split that keeps no update
        on the GPU (the host's are predicted to end within the GPU's iteration, or the share
        leaves none) is the all-host graph."""
        if place == "gpu":
            return self.graph
        if place == "host":
            return offload_updates(self.graph)
        if host_share is None:
            host_graph, host_plan = plans["host"]
            host_share = _host_share_within(pipeline.simulate(
                host_graph, host_plan,
                costs=pipeline.device_costs(host_graph, self.device, config.gpu)))
            if host_share >= 1:
                return host_graph
        return offload_updates(self.graph, host_share)

    def _place_notes(self, optimizer_on: str, chosen: str, places: list[str],
                     plans: dict[str, tuple[Any, Any]], failed: dict[str, ConfigError],
                     state: int) -> list[str]:
        """What `optimizer_on` chose (`chosen`), and the predicted step of every place it
        planned."""
        times = ", ".join(f"{p} {plans[p][1].header.predicted_time_s * 1e3:.1f} ms"
                          if p in plans else f"{p} infeasible" if p in failed
                          else f"{p} not planned" for p in places)
        notes = []
        if optimizer_on == "auto" and len(places) > 1:
            where = "split between the host and the GPU" if chosen == "split" else \
                f"on the {chosen}"
            notes.append(f"optimizer updates {where} (optimizer_on='auto': the weights, "
                         f"gradients and optimizer state, {format_bytes(state)}, exceed the "
                         f"budget; predicted a step: {times})")
        if chosen == "split":
            graph = plans["split"][0]
            host = sum(u.numel for u in offloaded_updates(graph))
            gpu = sum(graph.tensors[w].numel for w, _ in graph.meta["training"]["weight_grads"])
            notes.append(f"split: the host updates {host / (host + gpu):.0%} of the parameters "
                         f"as their gradients come, the GPU the last {gpu / (host + gpu):.0%} "
                         "(the weights the backward pass reaches last)")
        elif "split" in failed and optimizer_on == "split":
            notes.append(f"split: no plan, so every update runs on the host ({failed['split']})")
        elif "split" in places and "host" in plans and "split" not in failed:
            notes.append("split: no update is left to the GPU (the host's are predicted to "
                         "end within the GPU's iteration, or host_share is near 1), so all of "
                         "them stay on the host")
        return notes

    def _check_host_memory(self) -> int:
        """The host memory the run will add (the plan's pinned slow tier, the host's optimizer
        state), checked against what the host has available before any of it is pinned."""
        pool = slow_tier_layout(self.run_graph, self.plan)[1]
        taken = pinned_footprint(pool, pin=self.device.startswith("cuda"))
        state = self.host.state_bytes if self.host is not None else 0
        pinned = f", pinned as {format_bytes(taken)}" if taken != pool else ""
        what = f"Trainer: the plan's slow tier ({format_bytes(pool)}{pinned})" + (
            f" with the host's optimizer state ({format_bytes(state)})" if state else "")
        check_host_fits(taken + state, what, SLOW_TIER_FIX)
        return taken + state

    @property
    def steps(self) -> int:
        # closed: the steps it synced, all of them
        return self.loop.steps if self.loop is not None else self._synced

    def _capture(self, loss_fn: Callable[..., Any], channels_last: bool | None,
                 loss_chunks: int | str, precision: str = "fp32",
                 budget: Callable[[int], int | None] | None = None) -> tuple[Any, Any]:
        """The training graph of the module's forward at the example, and the capture.
        `budget`: the budget in bytes for a plain graph's peak (None: no budget)."""
        chunks = _chunks_option(loss_chunks)
        forward, rule, spec, captured = capture_training(
            self.module, self.optimizer, loss_fn, self.example, precision)
        self._spec = spec
        try:
            graph = derive_training(forward, optimizer=spec, loss=rule, loss_chunks=chunks or 1)
            if chunks is None:  # "auto": the plain graph says whether chunks pay
                chunks = auto_loss_chunks(graph, self.device, precision, None if budget is None
                                          else budget(graph.peak_live_bytes))
                if chunks > 1:
                    graph = derive_training(forward, optimizer=spec, loss=rule,
                                            loss_chunks=chunks)
                    self.notes.append(f"the loss in {chunks} blocks of tokens (loss_chunks="
                                      "'auto': its logits are a large share of the peak; "
                                      "loss_chunks=1 keeps the plain loss)")
        except ConfigError as exc:
            raise ConfigError(f"Trainer: loss_chunks={loss_chunks}: {exc}") from None
        _check_labels(graph, self.example)
        if channels_last is None:
            channels_last = self.device.startswith("cuda") and has_convolutions(graph)
        return (to_channels_last(graph) if channels_last else graph), captured

    # ---- training ------------------------------------------------------------------------
    def step(self, *batch: Any) -> torch.Tensor:
        """One planned iteration on `batch` (`x, y` or `(x1, x2), y`, as the example was
        given); returns the loss (a 0-d tensor on the device; `.item()` waits for it)."""
        if self.loop is None:
            raise ConfigError("Trainer: closed (close() handed the module its values and let "
                              "the plan's memory go): make a new Trainer to train on")
        current = split_example(batch if len(batch) == 2 else (batch[0] if batch else None))
        self._check_shapes(current)
        if self.host is None:
            self.loop.step(self._batch_masters(current))
        else:  # the last step's updates first: this one reads the weights they write
            self.host.wait()
            self.loop.step(self._batch_masters(current))
            self.host.start(self.loop.executor)
        self.notes += [n for n in self.loop.notes if n not in self.notes]
        return self.loop.value(self._ids[self.map.loss])

    def _batch_masters(self, batch: Example) -> dict[int, torch.Tensor]:
        """The batch and the current learning rate, as masters of the run graph's tensors
        (the host's updates read the rate themselves)."""
        ids = self._ids
        out = {ids[t]: x for t, x in zip(self.map.inputs, batch.inputs, strict=True)}
        out[ids[self.map.labels]] = batch.labels
        if self.map.lr is not None and self.map.lr in ids:
            lr = float(self.optimizer.param_groups[0]["lr"])
            out[ids[self.map.lr]] = torch.tensor(lr, dtype=torch.float32)
        return out

    def _check_shapes(self, batch: Example) -> None:
        for i, (got, want) in enumerate(zip((*batch.inputs, batch.labels),
                                             (*self.example.inputs, self.example.labels),
                                             strict=True)):
            if got.shape != want.shape or got.dtype != want.dtype:
                raise ConfigError(
                    f"batch item {i} has shape {tuple(got.shape)} ({got.dtype}), the "
                    f"example's {tuple(want.shape)} ({want.dtype}): the plan is for one batch "
                    "shape; drop the last partial batch (DataLoader(..., drop_last=True)) or "
                    "make a Trainer for the other shape")

    def describe(self) -> str:
        """The plan in one line: its budget against the unconstrained peak, and what it does to
        keep within it ("budget 96.00 KiB of a peak of 150.00 KiB (64%): 12 moves, 3
        recomputes")."""
        budget, peak = self.plan.header.budget_bytes, self.run_graph.peak_live_bytes
        moves = sum(1 for _ in self.plan.moves())
        recomputes = sum(1 for _ in self.plan.recomputes())
        cap = "no budget" if budget is None else (f"budget {format_bytes(budget)} of a peak "
                                                  f"of {format_bytes(peak)} ({budget / peak:.0%})")
        return f"{cap}: {moves} moves, {recomputes} recomputes"

    def sync(self) -> None:
        """Write the trained parameters, BatchNorm's running statistics and the optimizer's
        state into the module and the optimizer."""
        if self.steps == 0 or self.loop is None:
            return
        finals = self.loop.finals()
        shared: frozenset[int] = frozenset()
        if self.host is not None:
            full = {run: t for t, run in self._ids.items()}
            finals = {full[run]: value for run, value in finals.items()} | self.host.finals()
            shared = frozenset(self.host.shared)
        self.map.write_back(finals, self.optimizer, shared)
        self._count_batches(self.steps - self._synced)
        self._synced = self.steps

    def close(self) -> None:
        """`sync`, then give the module and the optimizer values of their own and let the
        Trainer's memory go (its executor, the slow tier's pool, the host's optimizers). With
        the updates on the host the module's parameters are views of the pool's masters and
        the optimizer's moments are the host's own (`HostSide.shared`), which would otherwise
        keep the whole pool alive as long as the module; close copies them out first (the
        module's bytes again, for a moment beside the pool). The Trainer cannot step after."""
        if self.loop is None:
            return
        self.sync()  # the host's updates waited for (`HostSide.finals`)
        if self.host is not None:
            self.map.own_copies(self.optimizer, frozenset(self.host.shared))
        self.loop = self.host = None  # type: ignore[assignment]  # the executor and its pool

    def _count_batches(self, steps: int) -> None:
        """BatchNorm's `num_batches_tracked`, which torch bumps in every training forward."""
        for module in self.module.modules():
            counter = getattr(module, "num_batches_tracked", None)
            if isinstance(counter, torch.Tensor) and getattr(module, "track_running_stats",
                                                             False):
                counter.add_(steps)


# loss_chunks="auto" on a GPU: the chunked loss pays where the logits are a large share of the
# peak (H200, bf16, 2026-12-04: GPT-2 small b16 s1024, bf16 logits 11% of a 14.3 GiB peak,
# all fast 50.7 ms in 16 chunks against 71.9 plain; BERT-base b32 s512, 8%, its plan at 50% of
# the plain peak in chunks faster than the plain loss all fast), and costs one more product of
# the head where they are small. In fp32 the plain loss is the faster one all fast (H100,
# 2026-12-08: GPT-2 small b8 s1024 fp32 in 16 chunks 178.04 ms, plain 159.79 ms, native eager
# 160.05-160.30), so there the chunks come only with a budget under the plain graph's peak.
AUTO_LOSS_CHUNKS = 16
AUTO_CHUNK_SHARE = 1 / 16


def _budget_of(budget: int | None, ratio: str | None) -> Callable[[int], int | None] | None:
    """The Trainer's budget as a function of a graph's peak (bytes), None for no budget."""
    if budget is not None:
        return lambda peak: budget
    if ratio is None:
        return None
    share = parse_ratio(ratio, flag="Trainer: ratio")
    return None if share.fast_fraction >= 1 else share.budget


def _run_ids(graph: Any, run: Any) -> dict[int, int]:
    """The training graph's tensor ids -> the run graph's, for the tensors both have."""
    ids = run.tensor_ids_by_name
    return {t.id: ids[t.name] for t in graph.tensors if t.name in ids}


def _host_share_within(predicted: Any) -> float:
    """The share of the host's update work that a simulated all-host plan finishes by the end
    of the GPU's iteration (`SimulationResult.gpu_end_s`): a split hands the rest, the
    updates of the last gradients, to the GPU, which the simulation of the split's own plan
    then prices (1: the host is done in time, nothing to hand over). Never 0, which
    `offload_updates` refuses: where all of the host's work ends past the GPU's (its first
    gradient out only as the GPU ends), the smallest share, which leaves the host its first
    weight (`gpu_kept_updates`)."""
    past = predicted.host_end_s - predicted.gpu_end_s
    if past <= 0 or predicted.host_update_s <= 0:
        return 1.0
    return max(SMALLEST_SHARE, 1 - past / predicted.host_update_s)


# a share of the parameters above 0 and below every weight's share of any real model
SMALLEST_SHARE = 1e-9


def _share_option(host_share: float | None, optimizer_on: str) -> float | None:
    """The Trainer's `host_share`, checked: a fraction in (0, 1), for optimizer_on="split"."""
    if host_share is None:
        return None
    if optimizer_on != "split":
        raise ConfigError(f"Trainer: host_share={host_share!r} is for optimizer_on='split' (it "
                          f"has {optimizer_on!r}): drop it or split the updates")
    if isinstance(host_share, bool) or not isinstance(host_share, int | float) or \
            not 0 < host_share < 1:
        raise ConfigError(f"Trainer: host_share={host_share!r}: give the fraction of the "
                          "parameters the host updates, between 0 and 1 (exclusive)")
    return float(host_share)


# PlanConfig fields the Trainer's own arguments, device or mode set (`plan_options` may not)
TRAINER_SET = frozenset({"strategy", "ratio", "fast_mem_bytes", "device", "recompute", "run",
                         "gpu", "reserve_bytes", "time_limit_s"})


def _plan_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The Trainer's `plan_options`, checked: `PlanConfig` fields its arguments do not set
    (their values `PlanConfig` checks itself)."""
    options = dict(options or {})
    fields = {f.name for f in dataclass_fields(PlanConfig)} - TRAINER_SET
    unknown = sorted(set(options) - fields)
    if unknown:
        taken = [k for k in unknown if k in TRAINER_SET]
        raise ConfigError(f"Trainer: plan_options {', '.join(map(repr, unknown))}: "
                          + ("set by the Trainer's own arguments; pass them there" if taken
                             and len(taken) == len(unknown) else
                             f"not a planning option; choose from {', '.join(sorted(fields))}"))
    PlanConfig(**options)  # its values' errors now, not after the capture's minutes
    return options


def _chunks_option(loss_chunks: int | str) -> int | None:
    """The Trainer's `loss_chunks` as a number of blocks, None for "auto"."""
    if loss_chunks == "auto":
        return None
    if isinstance(loss_chunks, bool) or not isinstance(loss_chunks, int) or loss_chunks < 1:
        raise ConfigError(f"Trainer: loss_chunks={loss_chunks!r}: give a whole number >= 1 or "
                          "'auto'")
    return loss_chunks


def auto_loss_chunks(graph: Any, device: str, precision: str,
                     budget_bytes: int | None = None) -> int:
    """What loss_chunks="auto" chooses for the plain training graph `graph` on `device`:
    `AUTO_LOSS_CHUNKS` on a GPU where the loss can be chunked (`chunkable_logits_bytes`) and
    its logits are at least `AUTO_CHUNK_SHARE` of the peak, else 1 (on the CPU the chunks only
    add the head's product again: no padded classes, no aligned kernels to win). In fp32 also
    1 where the plain graph fits (`budget_bytes` None, no budget, or at least its peak): the
    plain fp32 loss is the faster all fast."""
    if not device.startswith("cuda"):
        return 1
    if precision == "fp32" and (budget_bytes is None or budget_bytes >= graph.peak_live_bytes):
        return 1
    loss_kernel = (graph.meta.get("training") or {}).get("loss_kernel")
    logits = None if loss_kernel is None else chunkable_logits_bytes(graph, int(loss_kernel))
    if logits is None or logits < AUTO_CHUNK_SHARE * graph.peak_live_bytes:
        return 1
    return AUTO_LOSS_CHUNKS


def capture_training(module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                     loss_fn: Callable[..., Any], example: Example,
                     precision: str = "fp32") -> tuple[Any, Any, Any, Any]:
    """The pieces of a training graph, before its loss is chunked or its updates moved: the
    module's forward at the example (imported, in `precision`), the loss function's rule, the
    optimizer's spec and the capture. Every parameter must require grad. The values stay in
    the module (`StateMap` reads them): the capture copies none."""
    params = [p for p in module.parameters() if p.requires_grad]
    spec = optimizer_of(optimizer, params)
    captured = capture_module(module, example.inputs, values=False)
    if captured.frozen:
        raise ConfigError(f"parameters {', '.join(sorted(captured.frozen))} do not require "
                          "grad: the Trainer trains every parameter the forward reads")
    forward = import_model(captured.model, name=type(module).__name__,
                           initializer_weights=True)
    rule = loss_rule(loss_fn, _stand_in_output(forward), example.labels)
    return with_precision(forward, precision), rule, spec, captured


def _stand_in_output(forward: Any) -> torch.Tensor:
    """Seeded random values of the shape of the forward's one output, on which the loss
    function is matched to a rule (`loss_rule` compares values the rules compute from any
    output): running the module itself on the example costs a forward pass on its device,
    the host's cores for a module too large for the GPU (the 0.30B decoder at batch 8: 9-10
    s on a 2-core machine; the 3.33B decoder at batch 12 spent about 170 s of its 297 s setup
    on the H100 machine before the exporter's output was folded, 2026-12-05)."""
    if len(forward.outputs) != 1:
        raise ConfigError(f"the module's forward returns {len(forward.outputs)} tensors: the "
                          "Trainer takes modules whose forward returns one tensor (the output "
                          "the loss reads)")
    shape = forward.tensors[forward.outputs[0]].shape
    return torch.randn(shape, generator=torch.Generator().manual_seed(0))


def _check_labels(graph: Any, example: Example) -> None:
    labels = graph.tensors[graph.meta["training"]["labels"]]
    if tuple(example.labels.shape) != labels.shape:
        raise ConfigError(f"the example's labels have shape {tuple(example.labels.shape)}, the "
                          f"loss reads {labels.shape}")
