"""A sweep's tasks as Ray tasks (`--engine ray`): on a cluster (`--address`) or on a Ray
instance this driver starts on its own machine (no address).

What goes to the workers, deliberately:
- the package's code, as the job's ``runtime_env`` (``py_modules``: the `autotm_py` folder the
  driver imported), so every worker runs the driver's version of it; its dependencies (pulp,
  highspy, onnx, torch for ``--execute``) must be installed on the nodes. The user's working
  directory is not sent (no ``working_dir``).
- the sweep's files (`ship.Inputs`: model files, profiles, a memory-system file) once, through
  the object store (`ray.put`); every task gets a reference to them.
- each task's own plans from `--plans` (`ship.PlanBox`) in its arguments; the plans it solves
  come back in its result, and the driver writes them.

Each task asks for `cpus_per_task` CPUs, and one GPU when it runs plans on the GPU (Ray then
sets ``CUDA_VISIBLE_DEVICES`` to that GPU). A worker that dies is retried by Ray
(``max_retries``), `MAX_ATTEMPTS` attempts in all. Ray is imported only here, only when used.
"""

from __future__ import annotations

import logging
import socket
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from autotm_py.bench.ship import Inputs, PlanBox
from autotm_py.bench.spec import BenchSpec
from autotm_py.bench.tasks import (
    MAX_ATTEMPTS,
    Failure,
    Task,
    TaskFn,
    TaskResult,
    cpus_per_task,
    guarded,
    run_task,
    uses_gpus,
)
from autotm_py.errors import ConfigError

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the autotm_py folder workers import


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("--engine ray needs Ray, which is not installed: "
                          "pip install 'autotm_py[ray]'") from None
    return ray


def check_address(address: str | None) -> None:
    """A plain TCP connection to HOST:PORT before `ray.init`: where nothing answers, `ray.init`
    waits about a minute, then may abort the whole process."""
    if address is None or address in ("auto", "local") or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--address {address!r}: give HOST:PORT of the Ray head (the address "
                          "`ray start --head` prints), or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as exc:
        raise ConfigError(f"--address {address}: no Ray cluster answers there "
                          f"({exc.strerror or exc}); start one with `ray start --head`, or "
                          "check the address") from None


def _entry(task_fn: TaskFn, spec: BenchSpec, task: Task, inputs: Inputs,
           plans: PlanBox) -> TaskResult | Failure:
    """What a Ray worker runs."""
    return guarded(task_fn, spec, task, inputs, plans)


class RayEngine:
    """Submit tasks to Ray and yield them as they finish; `workers` caps the tasks in flight
    (default: all of them, Ray schedules them by their resources)."""

    def __init__(self, *, address: str | None = None, workers: int | None = None,
                 task_fn: TaskFn = run_task) -> None:
        self.ray = import_ray()
        self.workers, self.task_fn = workers, task_fn
        self._connected_here = False
        if not self.ray.is_initialized():  # else: the caller's Ray (a notebook, a test)
            self._connect(address)

    def _connect(self, address: str | None) -> None:
        check_address(address)
        options: dict[str, Any] = {"runtime_env": {"py_modules": [str(PACKAGE_DIR)]},
                                   "log_to_driver": False, "logging_level": logging.WARNING}
        if address is None:
            options["include_dashboard"] = False
        try:
            self.ray.init(address=address, **options)
        except (ConnectionError, ValueError, RuntimeError, TimeoutError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            where = "a local Ray instance" if address is None else f"--address {address}"
            raise ConfigError(f"{where}: {first}") from None
        self._connected_here = True

    def run(self, spec: BenchSpec, tasks: Sequence[Task], plans_for: Any
            ) -> Iterator[tuple[Task, TaskResult | Failure]]:
        ray = self.ray
        if uses_gpus(spec) and ray.cluster_resources().get("GPU", 0) < 1:
            raise ConfigError("the Ray cluster has no GPU: cells run with --execute on cuda "
                              "take one GPU each")
        inputs = ray.put(Inputs.pack(spec))
        remote = ray.remote(_entry).options(
            num_cpus=cpus_per_task(spec), num_gpus=1 if uses_gpus(spec) else 0,
            max_retries=MAX_ATTEMPTS - 1, retry_exceptions=False, name="autotm-bench")
        queue = deque(tasks)
        limit = self.workers or max(len(queue), 1)
        in_flight: dict[Any, Task] = {}
        try:
            while queue or in_flight:
                while queue and len(in_flight) < limit:
                    task = queue.popleft()
                    ref = remote.remote(self.task_fn, spec, task, inputs, plans_for(task))
                    in_flight[ref] = task
                (ref,), _ = ray.wait(list(in_flight), num_returns=1)
                task = in_flight.pop(ref)
                yield task, self._outcome(ref)
        finally:
            for ref in in_flight:  # interrupted: stop what still runs
                ray.cancel(ref, force=True)

    def _outcome(self, ref: Any) -> TaskResult | Failure:
        ray = self.ray
        try:
            return ray.get(ref)
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                ray.exceptions.OutOfMemoryError) as exc:
            return Failure(f"{type(exc).__name__}: the worker died on each of {MAX_ATTEMPTS} "
                           "attempts")
        except ray.exceptions.RayError as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            return Failure(f"{type(exc).__name__}: {first}"[:300])

    def close(self) -> None:
        if self._connected_here:
            self.ray.shutdown()
            self._connected_here = False
