"""The optimizer updates a Trainer runs on the host (`Trainer(..., optimizer_on="host")`).

The GPU runs `ir.host_updates.offload_updates` of the training graph: it reads each trained
weight (fp32) from the slow tier and leaves its fp32 gradient there. `HostSide` takes those
slow-tier copies as the master weights (the executor's pinned pool, in the graph's layout)
and steps one torch optimizer per weight, of the user's kind and hyper-parameters (fused where
torch has a fused CPU kernel: AdamW updates 5.07e9 parameters a second on the H200's 16-core
host), on each in place with its gradient where the GPU left it: each update is torch's own,
and nothing is copied on the host.

The updates overlap the GPU's iteration: once an iteration is enqueued (`start`), a thread
takes the weights in the order the GPU makes their gradients, and for each waits for the copy
of its gradient out to the slow tier and for the last copy of its fed weight in (the executor
reports both as it enqueues them, with events: `Executor.copy_hook`; a CUDA graph's replays
record the captured events again), steps its optimizer at the learning rate the user's
optimizer has now (a scheduler's change takes effect at once). The next iteration waits for
the thread (`wait`): it reads those weights. The simulator prices the same order
(`runtime.simulate`, `_host_updates`). `finals` gives the masters and the optimizers' state
to the Trainer's `sync` in the training graph's ids.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import torch

from autotm_py.ir.graph import TensorGraph
from autotm_py.ir.host_updates import HostUpdate, offloaded_updates
from autotm_py.ir.optim import Optimizer
from autotm_py.memory.tiers import FAST, SLOW
from autotm_py.trainer.state import LeafValues, Masters, StateMap, as_graph

STATE_KEYS = ("exp_avg", "exp_avg_sq", "momentum_buffer")


class HostSide:
    """The host's masters and optimizers for the updates of run graph `run` (module
    docstring); `full` is the training graph `smap` maps."""

    def __init__(self, full: TensorGraph, run: TensorGraph, smap: StateMap,
                 optimizer: torch.optim.Optimizer, spec: Optimizer) -> None:
        self.full, self.run, self.smap = full, run, smap
        self.user, self.spec = optimizer, spec
        self.updates: tuple[HostUpdate, ...] = offloaded_updates(run)
        full_ids, run_ids = full.tensor_ids_by_name, run.tensor_ids_by_name
        self.weights = [full_ids[u.weight] for u in self.updates]
        self.fed = [run_ids[u.weight] for u in self.updates]
        self.grads = [run_ids[u.grad] for u in self.updates]
        # made when attached to an executor (`attach`): they live in its slow tier
        self.masters: list[torch.Tensor] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self._events: dict[tuple[int, str], Any] = {}  # the last iteration's copy events
        self._fresh: dict[tuple[int, str], Any] = {}  # this iteration's, as reported
        self._worker: threading.Thread | None = None
        self._failed: list[BaseException] = []
        # where the last finished iteration's host time went, in seconds (a diagnostic:
        # experiments/gpu/beyond_card.py prints it): the thread's span from `start`, its waits
        # for copy events, its optimizer steps, and how long the next step's `wait` blocked
        self.last_timing: dict[str, float] = {}
        self._timing: dict[str, float] = {}
        self.threads: int | None = None  # the updates' CPU threads (`update_threads`)
        # the weights (training graph ids) whose module parameter is its master's view
        self.shared: set[int] = set()

    @property
    def state_bytes(self) -> int:
        """The host memory its optimizers' state will take: Adam's two fp32 moments, SGD's
        momentum buffer (none without momentum), for every weight."""
        per_param = 8 if self.spec.kind != "sgd" else 4 if self.spec.momentum else 0
        return per_param * sum(u.numel for u in self.updates)

    def attach(self, executor: Any) -> None:
        """Make the masters, each the executor's slow-tier copy of its weight (the GPU reads
        it there; the update writes it in place), and one optimizer per weight (each update
        runs as soon as its gradient is out); have `executor` report the copies the updates
        wait for."""
        for tid, fed in zip(self.weights, self.fed, strict=True):
            master = self.slot(executor, fed)
            master.copy_(self.smap.master(self.full, tid))
            self._share_with_module(tid, master)
            self.masters.append(master)
            self.optimizers.append(torch_optimizer(self.spec, [master]))
        self._load_state()
        executor.hooked = frozenset(self.fed) | frozenset(self.grads)
        executor.copy_hook = self._copied
        self.threads = update_threads(executor.cuda)

    def _share_with_module(self, tid: int, master: torch.Tensor) -> None:
        """Make the module's parameter a view of its master where the graph holds its elements
        row-major, as they are or transposed (a Linear's W^T: the parameter is then a
        transposed view, not contiguous), in its dtype, on the host: the module's own fp32
        copy, 4 bytes a parameter, is freed, and the module holds the trained values once a
        step's updates are done (`Trainer.sync` waits for them). Any other weight (gathered
        elements, another layout or device) keeps the module's copy."""
        source = self.smap.weights[tid]
        param = self.smap.module_tensors[source.name]
        if source.index is not None or param.device.type != "cpu" or \
                param.dtype != master.dtype or not master.is_contiguous() or \
                master.numel() != param.numel():
            return
        if source.perm is None:
            view = master.view(param.shape)
        else:
            view = master.view([param.shape[axis] for axis in source.perm]).permute(
                tuple(int(a) for a in np.argsort(source.perm)))
        param.data = view
        self.shared.add(tid)

    def _load_state(self) -> None:
        """The user's optimizer state, where it has any (a resumed run), in the graph's
        layout; none: torch starts it as it would."""
        for tid, master, opt in zip(self.weights, self.masters, self.optimizers, strict=True):
            source = self.smap.weights[tid]
            state = self.user.state.get(self.smap.module_tensors[source.name]) or {}
            mine = {key: as_graph(state[key].detach().cpu().float(), self.full.tensors[tid],
                                  source).clone()
                    for key in STATE_KEYS if state.get(key) is not None}
            if "step" in state:
                mine["step"] = torch.as_tensor(state["step"], dtype=torch.float32).clone()
            if mine:
                opt.state[master] = mine

    # ---- each step ---------------------------------------------------------------------
    def _copied(self, tid: int, to: str, event: Any) -> None:
        self._fresh[(tid, to)] = event  # a fed tensor's last read overwrites the earlier ones

    def slot(self, executor: Any, tid: int) -> torch.Tensor:
        """The executor's slow-tier copy of `tid` (a fed weight or a drained gradient)."""
        return executor.pool.view(tid, self.run.tensors[tid])

    def start(self, executor: Any) -> None:
        """After an iteration is enqueued: the updates, on a thread, each once its gradient
        is out and its fed weight's last read of the iteration is done (their events: this
        iteration's, or, replayed as a CUDA graph, the captured ones, which each replay
        records again)."""
        self._events = self._fresh or self._events
        self._fresh = {}
        # not a daemon: the interpreter's exit waits for it (killed inside torch's CPU
        # kernels it aborts the process)
        self._worker = threading.Thread(target=self._guarded, args=(executor,),
                                        name="autotm-host-updates")
        self._worker.start()

    def wait(self) -> None:
        """Until the updates of the last iteration are done (the next one reads them)."""
        if self._worker is not None:
            blocked = time.perf_counter()
            self._worker.join()
            self._worker = None
            self.last_timing = self._timing | {"blocked_s": time.perf_counter() - blocked}
        if self._failed:
            raise self._failed.pop()

    def _guarded(self, executor: Any) -> None:
        try:
            self._update_all(executor)
        except BaseException as exc:
            self._failed.append(exc)

    def _update_all(self, executor: Any) -> None:
        if self.threads is not None:  # this thread's parallel regions (and later threads')
            torch.set_num_threads(self.threads)
        lr = float(self.user.param_groups[0]["lr"])
        began = time.perf_counter()
        waited = 0.0
        for i, (fed, grad) in enumerate(zip(self.fed, self.grads, strict=True)):
            since = time.perf_counter()
            for key in ((grad, SLOW), (fed, FAST)):
                event = self._events.get(key)
                if event is not None:
                    event.synchronize()
            waited += time.perf_counter() - since
            self._update(i, executor, lr)
        span = time.perf_counter() - began
        self._timing = {"span_s": span, "waited_s": waited, "updating_s": span - waited}

    def _update(self, i: int, executor: Any, lr: float) -> None:
        """Weight i's step at learning rate `lr`, on its gradient and its weight where the
        GPU left and reads them (the slow tier)."""
        master, opt = self.masters[i], self.optimizers[i]
        master.grad = self.slot(executor, self.grads[i])
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        master.grad = None

    def finals(self) -> dict[int, torch.Tensor]:
        """The masters and the optimizer's state by the training graph's ids, as the
        Trainer's `sync` takes the final values of carried tensors."""
        self.wait()
        out: dict[int, torch.Tensor] = dict(zip(self.weights, self.masters, strict=True))
        by_weight = {w: opt.state.get(m, {})
                     for w, m, opt in zip(self.weights, self.masters, self.optimizers,
                                          strict=True)}
        for tid, (weight, key) in self.smap.state.items():
            value = by_weight.get(weight, {}).get(key)
            if value is not None:
                out[tid] = value
        steps = [s["step"] for s in by_weight.values() if "step" in s]
        if self.smap.step is not None and steps:
            out[self.smap.step] = torch.as_tensor(steps[0], dtype=torch.float32)
        return out


def update_threads(cuda: bool) -> int | None:
    """The CPU threads the host's updates run on beside a GPU: one fewer than torch's, since
    the thread that waits for the GPU (a loss's `.item()`, a synchronize) spins on a core
    meanwhile, and a parallel kernel on every core is as slow as its thread that shares one:
    the Trainer's fused AdamW on 2 threads of a 2-core machine beside one spinning process ran
    0.77e9 parameters a second, against 1.59e9 alone and 0.83e9 on 1 thread
    (`experiments/gpu/cpu_adam_probe.py --beside-spin`, 2026-12-05); on the H100's 16-core
    host the Trainer's updates ran 1.4-3.8e9 beside the GPU against the probe's 4.3e9 alone.
    None (torch's own) on the CPU, where the iteration is done before they start."""
    return max(1, torch.get_num_threads() - 1) if cuda else None


def torch_optimizer(spec: Optimizer, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """torch's optimizer of `spec`'s kind and hyper-parameters over `params` (CPU tensors):
    the fused CPU kernel where torch has one, else the multi-tensor one."""
    if spec.kind == "sgd":
        make: Any = lambda **kw: torch.optim.SGD(  # noqa: E731
            params, lr=spec.lr, momentum=spec.momentum, dampening=spec.dampening,
            nesterov=spec.nesterov, weight_decay=spec.weight_decay, **kw)
    else:
        kind = torch.optim.AdamW if spec.decoupled else torch.optim.Adam
        make = lambda **kw: kind(params, lr=spec.lr, betas=spec.betas,  # noqa: E731
                                 eps=spec.eps, weight_decay=spec.weight_decay, **kw)
    try:
        return make(fused=True)  # type: ignore[no-any-return]
    except (RuntimeError, ValueError, TypeError):
        return make(foreach=True)  # type: ignore[no-any-return]


class RunMasters(LeafValues):
    """The values of the run graph's tensors without a producer (`LeafValues`): the training
    graph's (`Masters`) by name, and each fed tensor's slow-tier copy itself (the host wrote
    it: placing it is then no copy)."""

    def __init__(self, run: TensorGraph, full: Masters, fed: frozenset[int]) -> None:
        super().__init__(run)
        self.full = full
        self.fed: dict[int, torch.Tensor] = {}  # set once the executor's pool exists
        ids = full.graph.tensor_ids_by_name
        self.to_full = {t.id: ids[t.name] for t in run.tensors
                        if t.producer is None and t.id not in fed}

    def made(self, tid: int) -> torch.Tensor:
        if tid in self.fed:
            return self.fed[tid]
        return self.full[self.to_full[tid]]
