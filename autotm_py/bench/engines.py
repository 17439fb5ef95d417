"""Where a sweep's tasks run: in this process (`SerialEngine`), in worker processes on this
machine (`LocalEngine`, the default), or on a Ray cluster (`bench/ray_engine.py`).

Every engine takes the same tasks and yields ``(task, TaskResult | Failure)`` as they finish;
the driver (`runner.run_bench`) turns them into rows and alone writes files. A worker that
dies during a task (killed, out of memory) has the task run again, on a fresh worker, up to
`MAX_ATTEMPTS` times in all; then the task is a `Failure` and its rows are error rows, which the
next sweep retries.

GPU cells (``execute`` on cuda) take one GPU each: the local engine starts one worker per
visible GPU with ``CUDA_VISIBLE_DEVICES`` set to it, so no two cells share a GPU, and with a
share of this machine's CPUs of its own (`cpu_shares`), so that no worker's threads slow the
host dispatch of another's run. ILP cells take `BenchSpec.threads` CPUs each (1 by default).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol

from autotm_py.bench import env
from autotm_py.bench.ray_engine import RayEngine
from autotm_py.bench.ship import Inputs, PlanBox
from autotm_py.bench.spec import BenchSpec
from autotm_py.bench.tasks import (
    MAX_ATTEMPTS,
    Failure,
    Task,
    TaskFn,
    TaskResult,
    cpus_per_task,
    forget,
    guarded,
    run_task,
    uses_gpus,
)
from autotm_py.errors import ConfigError

log = logging.getLogger(__name__)

ENGINES = ("local", "ray")

Outcome = TaskResult | Failure
PlansFor = Callable[[Task], PlanBox]


class Engine(Protocol):
    def run(self, spec: BenchSpec, tasks: Sequence[Task], plans_for: PlansFor
            ) -> Iterator[tuple[Task, Outcome]]: ...

    def close(self) -> None: ...


def visible_gpus() -> list[str]:
    """The GPUs this process may use: `CUDA_VISIBLE_DEVICES` when set, else torch's count."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    try:
        import torch
    except ImportError:
        return []
    return [str(i) for i in range(torch.cuda.device_count())]


def cpu_shares(workers: int) -> list[list[int]] | None:
    """Disjoint sets of this process's CPUs, one per GPU worker (None if there are fewer CPUs
    than workers). Two executed cells at once on a 2-GPU, 32-CPU host, unpinned, slowed each
    other's host-bound runs: ResNet-200's all-fast iteration 1.62x (docs/bench.md), most likely
    each worker's torch threads (32 by default, spinning after every parallel region) taking
    the cores the other's dispatch thread needed."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    per = len(cpus) // max(workers, 1)
    if per == 0:
        return None
    return [cpus[i * per:(i + 1) * per] for i in range(workers)]


class SerialEngine:
    """Tasks one after another in this process: today's sweep (`--workers 1`)."""

    def __init__(self, task_fn: TaskFn = run_task) -> None:
        self.task_fn = task_fn

    def run(self, spec: BenchSpec, tasks: Sequence[Task], plans_for: PlansFor
            ) -> Iterator[tuple[Task, Outcome]]:
        for task in tasks:
            yield task, guarded(self.task_fn, spec, task, Inputs.local(), plans_for(task))

    def close(self) -> None:
        forget()


CPUS_VARIABLE = "AUTOTM_WORKER_CPUS"  # a GPU worker's CPUs, comma-separated


def _worker_main(conn: Connection, environ: dict[str, str], task_fn: TaskFn,
                 inputs: Inputs) -> None:
    """A local worker: tasks in, outcomes out, until the driver sends None or goes away."""
    os.environ.update(environ)  # before anything imports torch: the GPU this worker owns
    cpus = environ.get(CPUS_VARIABLE)
    if cpus:  # and its CPUs
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's; it stops us
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        spec, task, plans = message
        conn.send(guarded(task_fn, spec, task, inputs, plans))


@dataclass
class _Worker:
    slot: int
    process: Any  # multiprocessing.Process (spawn context)
    conn: Connection

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.process.join(timeout=1)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=5)
        self.conn.close()


class LocalEngine:
    """`workers` processes on this machine, each pinned to its GPU in `gpus` when given.

    Processes are spawned (not forked: CUDA and solver threads do not survive a fork) and kept
    for the whole sweep, so a worker keeps the models it loaded (`tasks._runner`)."""

    def __init__(self, workers: int, gpus: Sequence[str] | None = None,
                 task_fn: TaskFn = run_task, max_attempts: int = MAX_ATTEMPTS,
                 inputs: Inputs | None = None) -> None:
        self.workers, self.gpus = workers, list(gpus) if gpus else None
        self.task_fn, self.max_attempts = task_fn, max_attempts
        self.inputs = inputs or Inputs.local()
        self._ctx = mp.get_context("spawn")
        self._all: list[_Worker] = []
        self._cpus = cpu_shares(len(self.gpus)) if self.gpus else None

    def _start(self, slot: int) -> _Worker:
        environ = {"CUDA_VISIBLE_DEVICES": self.gpus[slot]} if self.gpus else {}
        if self._cpus is not None:
            environ[CPUS_VARIABLE] = ",".join(map(str, self._cpus[slot]))
            if "OMP_NUM_THREADS" not in os.environ:  # torch's threads: as many as its CPUs
                environ["OMP_NUM_THREADS"] = str(len(self._cpus[slot]))
        ours, theirs = self._ctx.Pipe()
        process = self._ctx.Process(target=_worker_main,
                                    args=(theirs, environ, self.task_fn, self.inputs),
                                    name=f"autotm-bench-{slot}", daemon=True)
        process.start()
        theirs.close()
        worker = _Worker(slot, process, ours)
        self._all.append(worker)
        return worker

    def run(self, spec: BenchSpec, tasks: Sequence[Task], plans_for: PlansFor
            ) -> Iterator[tuple[Task, Outcome]]:
        queue = deque(tasks)
        attempts: Counter[Task] = Counter()
        idle = [self._start(slot) for slot in range(min(self.workers, len(queue)))]
        busy: dict[int, tuple[_Worker, Task]] = {}
        while queue or busy:
            while queue and idle:
                worker, task = idle.pop(), queue.popleft()
                if not worker.process.is_alive():  # died after its last outcome
                    self._all.remove(worker)
                    worker.stop()
                    worker = self._start(worker.slot)
                worker.conn.send((spec, task, plans_for(task)))
                busy[worker.slot] = (worker, task)
            ready = wait([w.conn for w, _ in busy.values()]
                         + [w.process.sentinel for w, _ in busy.values()])
            for slot, (worker, task) in list(busy.items()):
                if worker.conn not in ready and worker.process.sentinel not in ready:
                    continue
                del busy[slot]
                outcome = _receive(worker)
                if outcome is not None:
                    idle.append(worker)
                    yield task, outcome
                    continue
                # the worker died during the task: retry it on a fresh one
                self._all.remove(worker)
                worker.stop()
                attempts[task] += 1
                code = worker.process.exitcode
                log.warning("bench: the worker running %s died (exit code %s), attempt %d of %d",
                            task.label, code, attempts[task], self.max_attempts)
                if attempts[task] < self.max_attempts:
                    queue.appendleft(task)
                else:
                    yield task, Failure(f"WorkerDied: the worker died on each of "
                                        f"{self.max_attempts} attempts (last exit code {code})")
                idle.append(self._start(slot))

    def close(self) -> None:
        for worker in self._all:
            worker.stop()
        self._all.clear()


def _receive(worker: _Worker) -> Outcome | None:
    """The worker's outcome, or None when it died before sending one."""
    try:
        if worker.conn.poll():
            return worker.conn.recv()
    except (EOFError, OSError):
        return None
    return None


def open_engine(kind: str, spec: BenchSpec, n_tasks: int, *, workers: int | None = None,
                address: str | None = None, task_fn: TaskFn = run_task) -> Engine:
    """The engine `kind` ("local" or "ray") for `n_tasks` tasks of `spec`.

    local: `workers` processes (default: one per visible GPU for GPU cells, else one per
    `cpus_per_task` CPUs), never more than there are tasks; one is this process itself.
    ray: see `bench/ray_engine.py`; `address` None starts a Ray instance on this machine."""
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers {workers}: at least 1")
    if kind == "ray":
        return RayEngine(address=address, workers=workers, task_fn=task_fn)
    if kind != "local":
        raise ConfigError(f"--engine {kind!r}: choose one of {', '.join(ENGINES)}")
    if address is not None:
        raise ConfigError("--address is for --engine ray (a Ray cluster to submit cells to)")
    gpus = visible_gpus() if uses_gpus(spec) else []
    if gpus:
        if workers is not None and workers > len(gpus):
            raise ConfigError(f"--workers {workers}: cells that run on the GPU take one GPU "
                              f"each, and {len(gpus)} GPU(s) are visible")
        slots = len(gpus)
    elif uses_gpus(spec):
        slots = 1  # no GPU here: one worker, whose runs fail and are noted, as serially
    else:
        slots = max(1, (os.cpu_count() or 1) // cpus_per_task(spec))
    n = min(workers or slots, max(n_tasks, 1))
    if n == 1:
        return SerialEngine(task_fn)
    # this machine's name, CPU and versions, asked once here (a GPU worker names its own GPU)
    made_on = None if gpus else env.environment(spec.device)
    return LocalEngine(n, gpus[:n] if gpus else None, task_fn=task_fn,
                       inputs=Inputs.local(made_on))
