"""One model of a bench sweep: load it and its costs once, then make one row per cell.

Baselines depend only on (model, ratio), so they are planned, simulated (and with ``execute``
run) once per ratio and copied into every row of that ratio. With ``execute``, what does not
depend on the ratio at all (all-fast run without a cap, torch.autograd with and without
`save_on_cpu`) is measured once per model by `model_columns`; the driver adds those columns to
every row of the model (`bench/tasks.py`), so the rows of one ratio can run on one GPU while
the model's own measurements run on another.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from autotm_py import api, pipeline
from autotm_py.bench import child
from autotm_py.bench.ship import PlanBox
from autotm_py.config import PlanConfig
from autotm_py.errors import AutoTMError
from autotm_py.ir import split_names
from autotm_py.options import RunMode
from autotm_py.plan import Plan
from autotm_py.report import PlanView, plan_metrics

if TYPE_CHECKING:
    from autotm_py.bench.spec import BenchSpec
    from autotm_py.planning import PlanResult

log = logging.getLogger(__name__)
T = TypeVar("T")

# Baselines run for real with --execute. all-slow is left out: it copies every tensor in and
# out around every use, which costs minutes of GPU time per model and tells nothing new.
EXECUTED_BASELINES = ("all-fast", "first-touch", "lru", "offload")
NO_ARENA = "no arena: the plan has none; it runs on torch's caching allocator"


def _column(baseline: str) -> str:
    return baseline.replace("-", "_")


def _one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"{type(exc).__name__}: {text}"


class ModelRunner:
    """Rows of one model. A model that cannot be loaded or priced gives error rows.

    `source` is where the model is read from when it is not `model` itself (a worker's copy of
    the driver's file); `shipped_dir` the shipped profiles' folder when not the package's;
    `names` the spec as the driver gave it, which names rows and plan files (`spec` may point
    at a worker's copies of its files). Plans are read from and solved into `plans` (the
    driver reads and writes the folder)."""

    def __init__(self, spec: BenchSpec, model: str, *, source: str | None = None,
                 shipped_dir: str | None = None, names: BenchSpec | None = None) -> None:
        self.spec, self.model = spec, model
        self.source = source or model
        self.names = names or spec
        self.error: str | None = None
        self.plans = PlanBox()
        self._ratio_columns: dict[str, dict[str, Any]] = {}
        self._ratio_notes: dict[str, list[str]] = {}
        self._model_columns: tuple[dict[str, Any], list[str]] | None = None
        self._failures: list[str] = []  # runs that failed while making the current row
        try:
            work = pipeline.load_workload(self.source, spec.model, device=spec.device,
                                          gpu=spec.gpu, profiles_dir=spec.profiles_dir,
                                          shipped_dir=shipped_dir)
            if spec.split_conv_grads:
                work = pipeline.split_workload(work, device=spec.device, gpu=spec.gpu,
                                               profiles_dir=spec.profiles_dir,
                                               shipped_dir=shipped_dir)
            self.graph, self.costs = work.graph, work.costs
            self.view = PlanView.from_graph(self.graph)
        except AutoTMError as exc:
            self.error = _one_line(exc)
            log.warning("bench: %s: %s", model, self.error)

    def config(self, ratio: str, strategy: str, solver: str) -> PlanConfig:
        return self.spec.plan_config(strategy, ratio, solver)

    def row(self, ratio: str, strategy: str, solver: str) -> dict[str, Any]:
        key = self.names.key_values(self.model, ratio, strategy, solver)
        if self.error is not None:
            return {**key, "status": "error", "error": self.error}
        self._failures = []
        try:
            config = self.config(ratio, strategy, solver)
            row = {**key, **self._graph_columns(), **self._baseline_columns(ratio, config)}
            row.update(self._fitted_plan_columns(config, ratio, strategy, solver))
        except AutoTMError as exc:
            log.warning("bench: %s %s %s %s: %s", self.model, ratio, strategy, solver, exc)
            return {**key, "status": "error", "error": _one_line(exc)}
        notes = [n for n in (row.get("notes"), *self.costs.notes()) if n]
        row["notes"] = "; ".join(notes + self._failures) or None
        return row

    def model_columns(self) -> tuple[dict[str, Any], list[str]]:
        """With `execute`, the measurements of the model itself, the same at every ratio, and
        the notes of those that failed: all-fast (the unlimited reference, run without a cap)
        and, when training, torch.autograd without and with `save_on_cpu`. Measured once.
        With `graph`, the all-fast iteration is replayed as a CUDA graph with static inputs
        (`autotm run --graph --no-cap`): the reference of plans that are replayed too."""
        if self.error is not None or not self.spec.execute:
            return {}, []
        if self._model_columns is None:
            self._failures = []
            cols: dict[str, Any] = {}
            s = self.spec
            try:
                all_fast = api.baselines(self.graph, self.config(s.ratios[0], s.plan_names[0],
                                                                 s.solvers[0]),
                                         costs=self.costs, names=("all-fast",))["all-fast"]
                if all_fast.feasible:
                    run = self._run(all_fast.plan, cap=False, replay=s.run.replay)
                    measured = _median_and_peak(run)
                    cols["measured_all_fast_s"] = measured[0]
                    cols["measured_all_fast_peak_bytes"] = measured[1]
                    cols["measured_all_fast_device_busy_s"] = getattr(run, "device_busy_s",
                                                                      None)
            except AutoTMError as exc:
                self._failures.append(f"all-fast failed: {_one_line(exc)[:160]}")
            cols.update(self._eager_columns())
            self._model_columns = (cols, list(self._failures))
        return self._model_columns

    # ---- columns -------------------------------------------------------------------------
    def _graph_columns(self) -> dict[str, Any]:
        g = self.graph
        return {"peak_bytes": g.peak_live_bytes, "max_working_set_bytes": g.max_working_set[0],
                "kernels": len(g.kernels), "estimated_kernels": self.costs.n_estimated,
                "scaled_kernels": self.costs.n_scaled,
                "borrowed_kernels": self.costs.n_borrowed,
                "oracle_s": float(sum(self.costs.times_s))}

    def _baseline_columns(self, ratio: str, config: PlanConfig) -> dict[str, Any]:
        if ratio not in self._ratio_columns:
            results = api.baselines(self.graph, config, costs=self.costs)
            facts = pipeline.budget_facts(self.graph, config, self.costs)
            cols: dict[str, Any] = {"transfer_bound_s": facts.transfer_bound_s}
            for name, res in results.items():
                cols[f"{_column(name)}_s"] = res.time_s if res.feasible else None
                if self.spec.execute and res.feasible and name in EXECUTED_BASELINES \
                        and name != "all-fast":  # once per model: `model_columns`
                    measured = self._measure_baseline(name, res.plan, config)
                    cols[f"measured_{_column(name)}_s"] = measured[0]
                    cols[f"measured_{_column(name)}_peak_bytes"] = measured[1]
            cols.update(self._checkpoint_columns(config))
            self._ratio_columns[ratio] = cols
            self._ratio_notes[ratio] = list(self._failures)  # failed baseline runs
        self._failures = list(self._ratio_notes[ratio])
        return self._ratio_columns[ratio]

    def _eager_columns(self) -> dict[str, Any]:
        """torch.autograd without and with `save_on_cpu` (training only)."""
        if not self.spec.model.training:
            return {}

        eager: dict[str, Any] = {}
        for column, offload in (("torch_autograd", False), ("save_on_cpu", True)):
            try:
                run = api.measure_autograd(self.graph, device=self._device,
                                       iterations=self.spec.iterations,
                                       warmup=self.spec.warmup, save_on_cpu=offload)
            except (AutoTMError, RuntimeError) as exc:
                self._failures.append(f"{column} failed: {_one_line(exc)[:160]}")
                continue
            eager[f"measured_{column}_s"] = run.median_s
            eager[f"measured_{column}_peak_bytes"] = run.peak_fast_bytes
        return eager

    def _checkpoint_columns(self, config: PlanConfig) -> dict[str, Any]:
        """PyTorch activation checkpointing of the same graph under the same cap, with the
        fewest segments that fit the budget (`runtime.eager.fit_checkpointing`)."""
        if not (self.spec.execute and self.spec.model.training):
            return {}
        budget = pipeline.budget_facts(self.graph, config, self.costs).user_budget
        if budget is None:
            return {}
        try:
            run = api.fit_checkpointing(self.graph, budget, device=self._device,
                                    iterations=self.spec.iterations, warmup=self.spec.warmup)
        except (AutoTMError, RuntimeError) as exc:
            self._failures.append(f"checkpoint failed: {_one_line(exc)[:160]}")
            return {}
        if run is None:
            self._failures.append("checkpointing fits the budget at no segment count")
            return {}
        return {"measured_checkpoint_s": run.median_s,
                "measured_checkpoint_peak_bytes": run.peak_fast_bytes,
                "checkpoint_segments": int(run.strategy.rsplit("-", 1)[1])}

    @property
    def _device(self) -> str:
        # an explicit index: the executor caps memory per device, which needs one
        return "cuda:0" if self.spec.device == "cuda" else self.spec.device

    def _solve(self, config: PlanConfig, name: str | None) -> PlanResult:
        """Solve, or read the plan a previous run solved for this cell (`plans_dir`, by its
        file `name`; the driver put the ones it found into `self.plans`)."""
        plan = self.plans.get(name) if name is not None else None
        if plan is not None and plan.header.model_hash != self.graph.model_hash:
            # solved for another graph of the model (an older importer, other kernels or
            # fusions): its times would be reported as this graph's, so it is solved again
            log.info("bench: %s was solved for another graph of %s: solving again", name,
                     self.model)
            plan = None
        if plan is not None:
            return pipeline.saved_result(self.graph, plan, config, self.costs, str(name))
        result = api.optimize(self.graph, config, costs=self.costs)
        if name is not None and result.plan is not None:
            self.plans.put(name, result.plan)
        return result

    def _fitted_plan_columns(self, config: PlanConfig, ratio: str, strategy: str,
                             solver: str) -> dict[str, Any]:
        """The plan's columns at the first headroom whose plan fits when it runs."""

        def attempt(headroom: float) -> dict[str, Any]:
            path = self.names.plan_path(self.model, ratio, strategy, solver, headroom)
            cols = self._plan_columns(replace(config, headroom=headroom),
                                      None if path is None else path.name)
            return {**cols, "headroom": headroom}

        return self._fit("", attempt, _misfit, lambda cols: cols.get("measured_s"))

    def _fit(self, label: str, attempt: Callable[[float], T],
             misfit: Callable[[T], str | None], measured: Callable[[T], float | None]) -> T:
        """AutoTM's defrag loop: `attempt` at each headroom in turn (only the given one
        without `fit`) until `misfit` finds nothing wrong; each miss goes into the notes.
        When no headroom runs cleanly (a run that makes the allocator retry at every headroom,
        then one that cannot be planned or fails), the fastest attempt that ran is kept: a
        user would pick that headroom, retries and all. A re-plan that fails (e.g. no solver
        on the GPU machine for a plan not solved beforehand) ends the loop the same way."""
        tried: list[tuple[float, T]] = []  # (headroom, attempt); an attempt may be None
        for headroom in self.spec.headrooms():
            try:
                result = attempt(headroom)
            except AutoTMError as exc:
                if not tried:
                    raise
                self._failures.append(f"{label}headroom {headroom:.2f}: {_one_line(exc)[:160]}")
                break
            ran_before = any(measured(t) is not None for _, t in tried)
            tried.append((headroom, result))
            why = misfit(result) if self.spec.fit else None
            if why is None and (measured(result) is not None or not ran_before):
                return result
            if why is None:  # nothing to run here (no plan): more headroom will not help
                break
            self._failures.append(f"{label}headroom {headroom:.2f}: {why}")
        ran = [(h, t) for h, t in tried if measured(t) is not None]
        if not ran:
            return tried[-1][1]
        headroom, best = min(ran, key=lambda ht: measured(ht[1]) or 0.0)
        self._failures.append(f"{label}no headroom ran without retries: kept the fastest run "
                              f"(headroom {headroom:.2f})")
        return best

    def _plan_columns(self, config: PlanConfig, name: str | None = None) -> dict[str, Any]:
        result = self._solve(config, name)
        st = result.stats
        row: dict[str, Any] = {
            "status": result.status, "budget_bytes": result.budget_bytes,
            "variables": st.variables, "constraints": st.constraints, "build_s": st.build_s,
            "solve_s": st.solve_s, "gap": st.gap, "hit_time_limit": st.hit_time_limit,
            "predicted_s": result.predicted_time_s, "all_fast_s": result.all_fast_time_s,
            "slowdown": result.slowdown,
        }
        if result.plan is None:
            row["notes"] = result.message  # why, in `optimize`'s words (`Smallest.message`)
            if result.smallest is not None:
                row["min_feasible_budget_bytes"] = result.min_feasible_budget_bytes
                row["forced_by"] = result.smallest.short(result.budget_bytes or 0)
            return row
        row["mode"] = result.plan.header.memory_system.get("mode")
        if self.spec.run.arena and result.plan.arena is None:
            # the row's options say arena: say that this plan has none, and why
            row["notes"] = next((n for n in result.plan.header.notes if
                                 n.startswith("no arena")), NO_ARENA)
        row.update(plan_metrics(result.plan, self.view).to_dict())
        sim = api.simulate(self.graph, result.plan, costs=self.costs, strict=False)
        row["peak_fast_bytes"] = sim.fast_peak_bytes
        row["recomputes"], row["recompute_s"] = len(sim.recomputes), sim.recompute_s
        # The prediction comes from this machine's costs: a plan read from --plans may have
        # been solved with profiles of another machine (its header keeps that prediction).
        row["predicted_s"] = sim.total_s
        row["slowdown"] = sim.total_s / result.all_fast_time_s if result.all_fast_time_s \
            else None
        if self.spec.execute:
            run = self._run_plan(result.plan)
            row["measured_s"], row["measured_peak_fast_bytes"] = _median_and_peak(run)
            if run is not None:
                row.update(_run_columns(run))
        return row

    def _run_plan(self, plan: Plan):
        """A solved plan's real run: with `arena`, at planned addresses (replayed with
        `graph`) in a process of its own (`bench/child.py`: the placed allocator must be
        installed before CUDA is used, and the sweep's other runs keep torch's allocator);
        else in this process, as the baselines run."""
        s = self.spec
        if not s.run.arena:
            return self._run(plan, replay=s.run.replay)
        # the child builds the graph again: the split, if any, with it
        options = replace(s.model, split_conv_grads=split_names(self.graph))
        request = child.RunRequest(model=self.source, options=options.to_dict(),
                                   mode=s.run.to_dict(), device=self._device,
                                   iterations=s.iterations, warmup=s.warmup,
                                   device_busy=s.run.replay)
        return self._guarded_run(plan, lambda: child.run_isolated(request, plan))

    def _measure_baseline(self, name: str, plan: Plan | None, config: PlanConfig
                          ) -> tuple[float | None, int | None]:
        """A capped baseline's run. With `fit`, a baseline gets the plans' defrag loop:
        planned again with more headroom while its run fails or the allocator retries."""
        first = self.spec.headrooms()[0]

        def attempt(headroom: float):
            if headroom == first:  # planned with the other baselines already
                return self._run(plan)
            again = api.baselines(self.graph, replace(config, headroom=headroom),
                                  costs=self.costs, names=(name,))[name]
            return self._run(again.plan if again.feasible else None)

        return _median_and_peak(self._fit(f"{name} at ", attempt, _run_misfit,
                                          lambda run: None if run is None else run.median_s))

    def _run(self, plan: Plan | None, *, cap: bool = True, replay: bool = False):
        """A real run of `plan` in this process, on torch's caching allocator (None when
        there is no plan or the run fails); `replay`: replayed as a CUDA graph with static
        inputs, and then one more replay profiled for the device's busy time."""
        return self._guarded_run(plan, lambda: api.execute(
            self.graph, plan, device=self._device, mode=RunMode(placed=False, replay=replay),
            iterations=self.spec.iterations, warmup=self.spec.warmup, capped=cap,
            device_busy=replay))

    def _guarded_run(self, plan: Plan | None, run_it: Callable[[], Any]):
        """`run_it()`, or None when there is no plan or the run fails (noted in the row)."""
        if plan is None:
            return None
        try:
            run = run_it()
        except AutoTMError as exc:
            log.warning("bench: running %s plan of %s failed: %s", plan.header.strategy,
                        self.model, exc)
            self._failures.append(f"run of {plan.header.strategy} failed: "
                                  f"{_one_line(exc)[:160]}")
            return None
        return run


def _misfit(cols: dict[str, Any]) -> str | None:
    """Why a solved plan did not fit when it ran (None: it fit, or there is no plan to run:
    infeasible or unsolved, where more headroom won't help)."""
    if "measured_s" not in cols:
        return None
    return _why_misfit(cols["measured_s"], cols.get("measured_alloc_retries"))


def _run_misfit(run) -> str | None:
    """Why a baseline's run did not fit (None: it ran without allocator retries)."""
    return "the run failed" if run is None else _why_misfit(run.median_s, run.alloc_retries)


def _why_misfit(measured_s: float | None, retries: int | None) -> str | None:
    if measured_s is None:
        return "the run failed"
    return f"{retries} allocator retries at the cap" if retries else None


def _run_columns(run) -> dict[str, Any]:
    """A plan run's diagnostics: host enqueue time, allocator retries (under the placed
    allocator: requests beyond its region), reserved peak, and how outputs reached their
    slots in an arena (copied there, or allocated there by their kernels)."""
    return {"measured_host_s": run.host_median_s,
            "measured_alloc_retries": run.alloc_retries,
            "measured_reserved_peak_bytes": getattr(run, "reserved_peak_bytes", None),
            "measured_replayed": getattr(run, "replayed", None),
            "measured_placed_outputs": getattr(run, "placed_outputs", None),
            "measured_copied_outputs": getattr(run, "copied_outputs", None),
            "measured_device_busy_s": getattr(run, "device_busy_s", None),
            "measured_device_span_s": getattr(run, "device_span_s", None)}


def _median_and_peak(run) -> tuple[float | None, int | None]:
    return (None, None) if run is None else (run.median_s, run.peak_fast_bytes)
