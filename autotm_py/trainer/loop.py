"""The part of training every front end shares: a plan made (or taken from the plan cache) for
a training graph, and its iterations run with real values.

`plan_for` prices the graph on the device (measuring, on a GPU, the kernels no profile has)
and solves it, or takes the plan kept for the same graph, options and costs
(`pipeline.cached_optimize`). `Loop` holds the executor and its driver across steps: each
`step` places new values (a batch, the learning rate) where the plan starts them and runs one
iteration (eager; with a replay driver the first on the capture stream, the second captured,
every later one replayed); `final` gives a carried tensor's value after the last step.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path

import torch

from autotm_py import pipeline
from autotm_py.config import PlanConfig
from autotm_py.costs import BORROWED_NOTE
from autotm_py.errors import ConfigError, ExecutionError
from autotm_py.ir.graph import TensorGraph
from autotm_py.ir.precision import check_precision
from autotm_py.options import AUTO_PRECISION, RunMode, default_precision
from autotm_py.plan import Plan
from autotm_py.runtime.device import check_budget_room
from autotm_py.runtime.drivers import ReplayDriver
from autotm_py.runtime.execute import new_executor

log = logging.getLogger(__name__)

# The run mode a GPU trains in unless told otherwise: the benchmark's fastest plans
# (docs/results.md) run at planned addresses, with kernels allocating their outputs at their
# slots (the placed allocator), replayed as a CUDA graph. The placed allocator becomes torch's
# CUDA allocator for the whole process, and can be installed only before the process first uses
# CUDA: a Trainer made after that copies those outputs into their slots instead and says so in
# its notes (on ResNet-50 b64, an H200: 4.7 ms of copies in a 36 ms step). On the CPU the plan
# runs eagerly on torch's allocator.
GPU_MODE = RunMode(arena=True, placed=True, replay=True)
CPU_MODE = RunMode(placed=False)
# Plans of a split graph solved again after measuring its split kernels: a pass may choose
# more chunks than the last (their measured workspace), whose kernels the next one measures
MEASURE_PASSES = 3


def default_mode(device: str) -> RunMode:
    """The run mode of training on `device` unless told otherwise."""
    return GPU_MODE if device.startswith("cuda") else CPU_MODE


def plan_for(graph: TensorGraph, config: PlanConfig, device: str, *,
             plans_dir: str | os.PathLike[str] | None = None, measure: bool = False,
             face: str = "cli") -> tuple[TensorGraph, Plan]:
    """The plan of a training graph under `config`, from the plan cache or solved (and kept),
    and the graph it runs: `graph`, or its split where the plan splits kernels to fit the budget
    (`config.split_conv_grads`; the same tensors, so the same values feed it). An infeasible
    budget is a `ConfigError` naming the smallest feasible one, the kernel that forces it and
    what does not fit, with the fix in `face`'s terms ("cli": options, as `autotm train` takes
    them; "trainer": the Trainer's arguments)."""
    check_budget_room(pipeline.user_budget(graph, config), device,
                      None if face == "trainer" else "autotm train")  # the Trainer names itself
    costs = pipeline.device_costs(graph, device, config.gpu, measure=measure)
    where = Path(plans_dir) if plans_dir is not None else pipeline.default_plans_dir()
    result = pipeline.cached_optimize(graph, config, costs, where)
    for _ in range(MEASURE_PASSES if measure else 0):
        if result.graph is None:  # not split: every kernel was measured above
            break
        # the split's own kernels (parts, chunks) were priced by estimate where no profile had
        # them: measure those, and plan again with their times and workspace
        split_costs = pipeline.device_costs(result.graph, device, config.gpu, measure=True)
        if not split_costs.summary.get("measured_now"):
            break
        result = pipeline.cached_optimize(graph, config, costs, where, fresh=True)
    if result.plan is None:
        least = result.smallest if result.status == "infeasible" and \
            result.min_feasible_budget_bytes is not None else None
        raise ConfigError(result.message if least is None else
                          least.message(result.budget_bytes or 0, face))
    return result.graph or graph, result.plan


def precision_on(precision: str, device: str) -> str:
    """`precision` ("fp32", "bf16" or "auto") for training on `device`: auto is the device's
    (`options.default_precision`; fp32 on a GPU without bf16 arithmetic)."""
    if precision != AUTO_PRECISION:
        return check_precision(precision)
    cuda = device.startswith("cuda")
    return default_precision(device, cuda and torch.cuda.is_bf16_supported())


def gpu_name(device: str) -> str | None:
    """This machine's GPU, whose profiles and link price the plan (None on the CPU)."""
    if not device.startswith("cuda"):
        return None
    return torch.cuda.get_device_name(torch.device(device))


class Loop:
    """A plan's iterations on `device` in `mode`, from `masters` (every tensor without a
    producer)."""

    def __init__(self, graph: TensorGraph, plan: Plan, device: str, mode: RunMode,
                 masters: MutableMapping[int, torch.Tensor]) -> None:
        self.graph, self.plan = graph, plan
        # the masters themselves, not a copy: the Trainer's make each value when it is placed
        _, self.executor, self.driver = new_executor(graph, plan, device, mode=mode,
                                                     masters=masters)
        self.steps = 0
        # a plan priced partly with another GPU's kernel times, or left without the arena its
        # run mode asks for (its packing did not fit), says so where the user looks
        self.notes: list[str] = [n for n in plan.header.notes
                                 if n.startswith((BORROWED_NOTE, "no arena", "split "))]

    def step(self, values: Mapping[int, torch.Tensor]) -> None:
        """One iteration, starting from `values` for the tensors they name (a batch, the
        learning rate) and from the last iteration's results for the carried ones."""
        self.executor.masters.update(values)
        ex, driver = self.executor, self.driver
        if isinstance(driver, ReplayDriver) and self.steps == 0:
            driver.warm_up()  # eagerly, on the capture's stream: cuBLAS and cuDNN set up
        else:
            if isinstance(driver, ReplayDriver) and self.steps == 1:
                self._capture(driver)
            if driver.replayed:
                ex.prepare_replay()
                driver.replay()  # type: ignore[attr-defined]
            else:
                ex.prepare()
                ex.run()
        self.steps += 1

    def _capture(self, driver: ReplayDriver) -> None:
        failed = driver.capture()
        driver.replayed = failed is None
        if failed is not None:
            self.notes.append(f"no CUDA graph: capture failed at {failed}; training runs "
                              "eagerly")
            log.warning(self.notes[-1])

    def value(self, tid: int) -> torch.Tensor:
        """A copy of a tensor's value after the last step (the next step overwrites it)."""
        return self.executor.value(tid).detach().clone()

    def final(self, first: int) -> torch.Tensor:
        """The value a carried tensor (its id at the iteration's start) has after the last
        step."""
        carried = self.executor.carry.get(first)
        if carried is None:
            raise ExecutionError(f"{self.graph.name_of(first)!r} has no value after the step")
        if self.executor.cuda:
            torch.cuda.synchronize(self.executor.device)
        return carried[1]

    def finals(self) -> dict[int, torch.Tensor]:
        """Every carried tensor's value after the last step."""
        return {first: self.final(first) for first, _ in self.graph.carried}

