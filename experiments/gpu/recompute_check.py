"""Issue 13 item 5 on the GPU: joint (keep / move / recompute) plans against all-fast and
activation checkpointing under the same cap, in one process, on one GPU.

The plans are solved beforehand on a CPU machine (`experiments/gpu/plan_recompute.sh`, HiGHS,
the shipped H100 profiles) and carried in `experiments/plans/recompute/`: per model and budget
one plan per headroom (the share of the budget left to the allocator's fragmentation). This
script needs only torch and onnx (no PuLP, no solver): it never plans. It measures, in this
order of importance (every model's first steps before any model's later ones):

1. per model, all-fast through our executor, uncapped: the reference time; then again with a
   CUDA event after every kernel, for the kernels' in-context times, on which every plan is
   simulated once more ("predicted here"; the plan's own prediction used the shipped profiles,
   where kernels no profile had are roofline estimates);
2. per model and budget (the plans' `budget_bytes`: 50% and 25% of the peak), the joint plans
   in increasing headroom under the cap (budget + 64 MiB, as `autotm run`): the first that runs
   without allocator retries is the result (out of memory or retries: the next headroom; every
   attempt is kept). A plan made with `--arena` runs at its planned addresses, and one made
   with `--arena --replay` (`--graph`) is replayed as a CUDA graph (headroom 0: tried first);
3. per model and budget, activation checkpointing of the native model (torchvision / Hugging
   Face, `native_compare.measure_native`: the fewest segments that fit the same cap) when those
   packages import;
4. per model and budget, the move-only plans carried beside them (plan name `async`), the same
   way as 2, and our graph's forward in checkpointed segments under the same cap
   (`runtime.eager.fit_checkpointing`; not with --no-ours);
5. per model, after every capped run (an uncapped run's memory must not be what a capped one
   meets): all-fast at planned addresses replayed as a CUDA graph (the reference of
   graph-priced plans: no host dispatch in either), and the native model eager (torchvision /
   Hugging Face, uncapped: what a PyTorch user runs).

Stops starting new measurements after `--budget-s` seconds (default 420) so that the whole run
stays within the device time it was given; what was skipped is listed. Writes
OUT_DIR/recompute_check.json after every measurement and prints a table at the end.

    python3 experiments/gpu/recompute_check.py OUT_DIR [--models resnet200,bert_base,...]
        [--merge: only merge OUT_DIR/*/recompute_check.json]
        [--plans experiments/plans/recompute] [--match '*arena_graph'] [--iterations 5]
        [--budget-s 420] [--no-native] [--no-ours] [--static-replay]
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "gpu"))

from autotm_py import arena  # noqa: E402
from autotm_py.costs import KernelCosts  # noqa: E402
from autotm_py.frontend.zoo import build_graph  # noqa: E402
from autotm_py.ir.training import derive_training  # noqa: E402
from autotm_py.machine import MachineModel  # noqa: E402
from autotm_py.memory.tiers import MemorySystem, preset  # noqa: E402
from autotm_py.options import Measure, RunMode  # noqa: E402
from autotm_py.plan import Plan  # noqa: E402
from autotm_py.planning.baselines import all_fast  # noqa: E402
from autotm_py.runtime import eager  # noqa: E402
from autotm_py.runtime.device import configure_cuda  # noqa: E402
from autotm_py.runtime.execute import execute  # noqa: E402
from autotm_py.runtime.simulate import Simulator  # noqa: E402

DEV = "cuda:0"  # --device cpu: a smoke test of the script itself (its times mean nothing)
STATIC_REPLAY = False  # --static-replay: plans without an arena replayed under the cap too
SLACK_MIB = 64  # the cap is budget + this, as `autotm run` (--slack-mib)
MODELS = ("resnet200", "bert_base", "inception_v4", "densenet264", "gpt2_small")
NATIVE = ("resnet200", "densenet264", "bert_base", "gpt2_small")  # native_compare's models


class Clock:
    """Seconds left of the run's budget; `allows(s)`: whether a step of about s fits."""

    def __init__(self, budget_s: float) -> None:
        self.start, self.budget_s = time.perf_counter(), budget_s
        self.skipped: list[str] = []

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.start)

    def allows(self, what: str, need_s: float = 10.0) -> bool:
        if self.left() >= need_s:
            return True
        self.skipped.append(what)
        print(f"skipped (device time budget): {what}", flush=True)
        return False


def load_plans(folder: Path, model: str, match: str = "*") -> list[tuple[Path, Plan]]:
    out = []
    for path in sorted(folder.glob(f"{model}_{match}.json*")):
        plan = Plan.load(path)
        if plan.header.model_name.split("/")[0] == model:
            out.append((path, plan))
    return out


def graph_of(plan: Plan):
    """The graph the plan was made for, rebuilt from its header's model options."""
    m = plan.header.model
    graph = build_graph(plan.header.model_name.split("/")[0], batch=m.batch, dims=dict(m.dims),
                        fuse=m.fuse)
    if m.training:
        graph = derive_training(graph, optimizer=m.optimizer or "sgd", loss=m.loss or "auto")
    plan.validate(graph)
    return graph


def predict(graph, plan: Plan, costs: KernelCosts) -> float | None:
    """The plan simulated on `costs` (non-strict: a timing, not a verification)."""
    memory = MemorySystem.from_dict(dict(plan.header.memory_system), origin="plan header")
    machine = MachineModel(graph, memory.with_budget(plan.header.budget_bytes), costs,
                           plan.header.pin_weights, plan.header.headroom)
    sim = Simulator(graph, plan, machine, strict=False)
    sim.run()
    return sim.result().total_s


def run_row(graph, plan: Plan, iterations: int, warmup: int) -> dict[str, Any]:
    # a plan made with --arena runs at its planned addresses, and one priced for replay
    # (--replay) is replayed as a CUDA graph, as `autotm run --arena [--replay]` would; with
    # --static-replay a plan without an arena is replayed under the cap with static inputs
    # (the graph's private pool on torch's caching allocator: no slot copies, no scratch region)
    arena = plan.arena is not None
    replay = DEV.startswith("cuda") and (
        (arena and plan.header.run.replay) or (STATIC_REPLAY and not arena))
    try:
        # placed=False: the runtime's execute installs no placed allocator (as before)
        r = execute(graph, plan, device=DEV, mode=RunMode(arena=arena, placed=False, replay=replay),
                    measure=Measure(iterations=iterations, warmup=warmup,
                                    cap_slack_bytes=SLACK_MIB << 20))
    except Exception as exc:  # (out of memory under the cap, or a bug: recorded)
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        del exc
        gc.collect()  # what a traceback's cycles hold would count against the next cap
        torch.cuda.empty_cache()
        return {"error": error, **_left_behind()}
    torch.cuda.empty_cache()
    return {"median_s": r.median_s, "iteration_times_s": list(r.iteration_times_s),
            "peak_bytes": r.peak_fast_bytes, "cap_bytes": r.cap_bytes,
            "alloc_retries": r.alloc_retries, "host_median_s": r.host_median_s,
            "reserved_peak_bytes": r.reserved_peak_bytes,
            "capture_reserved_bytes": r.capture_reserved_bytes,
            "slow_pool_bytes": r.slow_pool_bytes, "arena": arena, "graph": r.replayed,
            "replay_wanted": replay,
            "notes": list(r.notes)}


def all_fast_plan(graph) -> tuple[MachineModel, Plan]:
    """The all-fast plan of `graph` and the machine it was made on (no costs needed)."""
    machine = MachineModel(graph, preset("h100-pcie5"), KernelCosts.from_times(
        "cuda", [0.0] * len(graph.kernels)))
    return machine, all_fast(machine)


def plan_info(path: Path, plan: Plan, graph, ctx: KernelCosts | None) -> dict[str, Any]:
    h = plan.header
    return {"file": path.name, "strategy": h.strategy, "headroom": h.headroom,
            "budget_bytes": h.budget_bytes, "predicted_s": h.predicted_time_s,
            "predicted_here_s": predict(graph, plan, ctx) if ctx is not None else None,
            "modelled_peak_bytes": h.counts.get("fast_peak_bytes"),
            "recomputes": h.counts.get("recomputes", 0),
            "recompute_s": h.counts.get("recompute_s", 0.0),
            "moved_bytes": sum(int(v) for k, v in h.counts.items() if k.startswith("bytes_")),
            "solver_status": h.solver.status, "gap": h.solver.gap}


def first_fit(graph, plans: list[tuple[Path, Plan]], ctx, args, clock: Clock,
              label: str) -> dict[str, Any]:
    """Plans in increasing headroom: the first that runs without allocator retries."""
    attempts = []
    for path, plan in sorted(plans, key=lambda pp: pp[1].header.headroom):
        if not clock.allows(f"{label} {path.name}", 15.0):
            break
        row = plan_info(path, plan, graph, ctx) | run_row(graph, plan, args.iterations,
                                                          args.warmup)
        attempts.append(row)
        print(f"  {label} h{plan.header.headroom:.2f}: " + (
            (row["error"][:120] + f" [left allocated {row.get('left_allocated_bytes', 0) >> 20}"
             f" MiB, reserved {row.get('left_reserved_bytes', 0) >> 20} MiB, by pool "
             f"{row.get('left_segments_by_pool_and_stream')}]"
             if "error" in row else None)
            or f"{_brief(row)}, retries {row['alloc_retries']}, predicted "
            f"{_ms(row['predicted_s'])} (here {_ms(row['predicted_here_s'])})"), flush=True)
        if _clean(row):
            break
    ran = [a for a in attempts if "error" not in a]
    clean = [a for a in ran if _clean(a)]
    best = clean[0] if clean else min(ran, key=lambda a: a["median_s"], default=None)
    return {"result": best, "attempts": attempts}


def _left_behind() -> dict[str, int | None]:
    """Bytes still allocated and reserved on the device after a failed run and a cache flush:
    what the next run's cap would meet."""
    if not DEV.startswith("cuda"):
        return {}
    pools: dict[str, int] = {}
    for seg in torch.cuda.memory._snapshot().get("segments", []):
        key = f"{tuple(seg.get('segment_pool_id', ()))} {seg.get('stream')}"
        pools[key] = pools.get(key, 0) + int(seg.get("total_size", 0))
    return {"left_allocated_bytes": torch.cuda.memory_allocated(DEV),
            "left_reserved_bytes": torch.cuda.memory_reserved(DEV),
            "left_segments_by_pool_and_stream": pools}


def _clean(row: dict[str, Any]) -> bool:
    """Ran without allocator retries, and replayed where a replay was asked for (a capture
    that fails under the cap falls back to eager iterations: not the run that was asked for)."""
    return "error" not in row and not row["alloc_retries"] and \
        (row["graph"] or not row["replay_wanted"])


def native_checkpointing(name: str, options, budget: int | None, args) -> dict[str, Any]:
    """torchvision / Hugging Face under the cap, the fewest segments that fit (budget None:
    native eager, uncapped)."""
    try:
        import native_compare

        out = native_compare.measure_native(name, options.batch, dict(options.dims),
                                            args.iterations, budget)
    except Exception as exc:  # (torchvision/transformers missing, ...)
        out = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    torch.cuda.empty_cache()
    print(f"  native {'eager' if budget is None else 'checkpointing'}: {_brief(out)}",
          flush=True)
    return out


def our_checkpointing(graph, budget: int, args) -> dict[str, Any] | None:
    """Our graph's forward in checkpointed segments under the cap, the fewest that fit."""
    try:
        fit = eager.fit_checkpointing(graph, budget, device=DEV, iterations=args.iterations,
                                      warmup=args.warmup)
        out = None if fit is None else {"median_s": fit.median_s,
                                        "peak_bytes": fit.peak_fast_bytes,
                                        "notes": list(fit.notes)}
    except Exception as exc:
        out = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    torch.cuda.empty_cache()
    print(f"  our graph checkpointed: {_brief(out)}", flush=True)
    return out


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def _mib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**20:.0f} MiB"


def _brief(row: dict[str, Any] | None) -> str:
    if not row:
        return "does not fit"
    if row.get("median_s") is None:
        return row.get("error") or f"out of memory at {row.get('out_of_memory_at')}"
    return f"{_ms(row['median_s'])}, peak {_mib(row.get('peak_bytes'))}"


class Model:
    """One model's graph, plans by budget and family, and its result row."""

    def __init__(self, name: str, plans: list[tuple[Path, Plan]]) -> None:
        self.name = name
        self.options = plans[0][1].header.model
        self.graph = graph_of(plans[0][1])
        self.ctx: KernelCosts | None = None
        self.plans: dict[int, dict[str, list[tuple[Path, Plan]]]] = {}
        for path, plan in plans:
            self.plans.setdefault(int(plan.header.budget_bytes), {}).setdefault(
                plan.header.strategy, []).append((path, plan))
        g = self.graph
        self.row: dict[str, Any] = {
            "model": name, "graph": g.name, "kernels": len(g.kernels),
            "options": {"batch": self.options.batch, "dims": dict(self.options.dims),
                        "fuse": self.options.fuse},
            "peak_bytes": g.peak_live_bytes, "budgets": {}}
        print(f"== {name}: {len(g.kernels)} kernels, {len(plans)} plans", flush=True)

    def cell(self, budget: int) -> dict[str, Any]:
        share = budget / self.graph.peak_live_bytes
        return self.row["budgets"].setdefault(f"{share:.2f}", {
            "budget_bytes": budget, "share_of_peak": share, "checkpointing": {}})

    def all_fast(self, args) -> None:
        graph = self.graph
        _, reference = all_fast_plan(graph)
        row: dict[str, Any] = {}
        try:
            plain = execute(graph, reference, device=DEV, measure=Measure(
                iterations=args.iterations, warmup=args.warmup, capped=False))
            row |= {"median_s": plain.median_s, "peak_bytes": plain.peak_fast_bytes}
            timed = execute(graph, reference, device=DEV, measure=Measure(
                iterations=args.iterations, warmup=1, capped=False, kernel_times=True))
            if timed.kernel_times_s is not None:
                self.ctx = KernelCosts.from_times("cuda", timed.kernel_times_s)
                row |= {"with_kernel_events_s": timed.median_s,
                        "kernel_times_sum_s": sum(timed.kernel_times_s)}
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        torch.cuda.empty_cache()
        self.row["all_fast"] = row
        print(f"  {self.name} all-fast: {_brief(row)}", flush=True)

    def references(self, args) -> None:
        """After the capped runs (an uncapped run's memory must not be what a capped one
        meets): all-fast at planned addresses replayed as a CUDA graph, the reference of the
        graph-priced plans (no host dispatch in either), and the native model eager."""
        graph, row = self.graph, self.row.setdefault("all_fast", {})
        machine, reference = all_fast_plan(graph)
        if DEV.startswith("cuda"):
            try:
                # packed for and run without the placed allocator (one scratch region)
                run = RunMode(arena=True, placed=False)
                packed = reference.with_arena(arena.pack(replace(machine, run=run), reference))
                measure = Measure(iterations=args.iterations, warmup=args.warmup, capped=False)
                replayed = execute(graph, packed, device=DEV, mode=replace(run, replay=True),
                                   measure=measure)
                row |= {"graph_s": replayed.median_s, "graph_replayed": replayed.replayed,
                        "graph_peak_bytes": replayed.peak_fast_bytes}
                # replayed with static inputs: no kernel output copied into a slot
                pooled = execute(graph, reference, device=DEV, mode=RunMode(replay=True),
                                 measure=measure)
                row |= {"graph_pool_s": pooled.median_s if pooled.replayed else None,
                        "graph_pool_reserved_bytes": pooled.capture_reserved_bytes}
            except Exception as exc:
                row["graph_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            torch.cuda.empty_cache()
            print(f"  {self.name} all-fast replayed: {_ms(row.get('graph_s'))} in an arena, "
                  f"{_ms(row.get('graph_pool_s'))} with static inputs", flush=True)
        if not args.no_native and self.name in NATIVE:  # what a PyTorch user runs, uncapped
            row["native"] = native_checkpointing(self.name, self.options, None, args)


def tasks(models: list[Model], args) -> list[tuple[str, Model, int | None, str]]:
    """(what, model, budget, family) in the order of importance: every model's all-fast and
    joint plans first, then native checkpointing, then move-only plans and our checkpointing,
    then the uncapped references (after every capped run)."""
    out: list[tuple[str, Model, int | None, str]] = []
    for m in models:
        out.append(("all-fast", m, None, ""))
        for budget in sorted(m.plans, reverse=True):
            out += [("plan", m, budget, f) for f in sorted(m.plans[budget]) if "recompute" in f]
    for m in models:
        if not args.no_native and m.name in NATIVE:
            out += [("native", m, budget, "") for budget in sorted(m.plans, reverse=True)]
    for m in models:
        for budget in sorted(m.plans, reverse=True):
            out += [("plan", m, budget, f) for f in sorted(m.plans[budget])
                    if "recompute" not in f]
            if not args.no_ours:
                out.append(("ours", m, budget, ""))
    out += [("references", m, None, "") for m in models]
    return out


NEED_S = {"all-fast": 20.0, "plan": 15.0, "native": 45.0, "ours": 45.0, "references": 30.0}


def run_task(task: tuple[str, Model, int | None, str], args, clock: Clock) -> None:
    what, m, budget, family = task
    label = f"{m.name} {what} {family} {'' if budget is None else budget >> 20} MiB".strip()
    if not clock.allows(label, NEED_S[what]):
        return
    if what == "all-fast":
        m.all_fast(args)
        return
    if what == "references":
        m.references(args)
        return
    assert budget is not None
    cell = m.cell(budget)
    print(f" {m.name} budget {budget / 2**20:.0f} MiB ({cell['share_of_peak']:.0%} of the "
          "peak)", flush=True)
    if what == "plan":
        cell[family] = first_fit(m.graph, m.plans[budget][family], m.ctx, args, clock, family)
    elif what == "native":
        cell["checkpointing"]["native"] = native_checkpointing(m.name, m.options, budget, args)
    else:
        cell["checkpointing"]["ours"] = our_checkpointing(m.graph, budget, args)


def table(rows: list[dict[str, Any]]) -> list[str]:
    def ms(x: Any) -> str:
        return f"{'-' if x is None else f'{x * 1e3:.1f}':>9}"

    out = [f"{'model':12} {'budget':>6} {'plan':16} {'head':>5} {'median':>9} {'pred':>9} "
           f"{'pred@ctx':>9} {'peak MiB':>9} {'all-fast':>9} {'fast grph':>9} {'native':>9} "
           f"{'native ck':>9} {'our ck':>9}"]
    for row in rows:
        fast = row.get("all_fast", {}).get("median_s")
        fast_graph = row.get("all_fast", {}).get("graph_s")
        native_eager = (row.get("all_fast", {}).get("native") or {}).get("median_s")
        for share, cell in row["budgets"].items():
            ck = cell.get("checkpointing", {})
            native = (ck.get("native") or {}).get("median_s")
            ours = (ck.get("ours") or {}).get("median_s")
            for family, fit in cell.items():
                if not isinstance(fit, dict) or "attempts" not in fit:
                    continue
                r = fit["result"] or {}
                peak = r.get("peak_bytes")
                head = r.get("headroom")
                out.append(f"{row['model']:12} {share:>6} {family:16} "
                           f"{'-' if head is None else f'{head:.2f}':>5} "
                           f"{ms(r.get('median_s'))} {ms(r.get('predicted_s'))} "
                           f"{ms(r.get('predicted_here_s'))} "
                           f"{'-' if peak is None else f'{peak / 2**20:.0f}':>9} {ms(fast)} "
                           f"{ms(fast_graph)} {ms(native_eager)} {ms(native)} {ms(ours)}")
    return out


def merge(folder: Path) -> int:
    """One results file and table from the per-model runs in folder/MODEL/ (the shell script
    runs every model in a process of its own: a failed capture or a leaked pool in one model's
    runs cannot reach the next model's)."""
    docs = [json.loads(p.read_text()) for p in sorted(folder.glob("*/recompute_check.json"))]
    if not docs:
        print(f"error: no {folder}/*/recompute_check.json to merge", file=sys.stderr)
        return 2
    rows = [row for doc in docs for row in doc["rows"]]
    doc = {"format": "autotm-recompute-check", "version": 1, "meta": docs[0]["meta"],
           "rows": rows, "skipped": [s for d in docs for s in d.get("skipped", [])],
           "wall_s": sum(d.get("wall_s", 0.0) for d in docs)}
    (folder / "recompute_check.json").write_text(json.dumps(doc, indent=1))
    write_table(folder, rows)
    return 0


def write_table(folder: Path, rows: list[dict[str, Any]]) -> None:
    """Print the table of `rows` and write it to folder/recompute_check.txt."""
    lines = table(rows)
    print("\n".join(lines))
    (folder / "recompute_check.txt").write_text("\n".join(lines) + "\n")


def main() -> int:
    global DEV, SLACK_MIB, STATIC_REPLAY
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--plans", type=Path, default=ROOT / "experiments/plans/recompute")
    parser.add_argument("--match", default="*",
                        help="only plan files MODEL_<match>.json*, e.g. '*arena_graph'")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="start no new measurement after this many seconds")
    parser.add_argument("--no-native", action="store_true",
                        help="skip torchvision / Hugging Face checkpointing")
    parser.add_argument("--no-ours", action="store_true",
                        help="skip our graph's forward in checkpointed segments")
    parser.add_argument("--device", default="cuda:0", help="cpu: a smoke test of the script")
    parser.add_argument("--slack-mib", type=int, default=64,
                        help="cap plans at budget + this (autotm run: 64)")
    parser.add_argument("--static-replay", action="store_true",
                        help="replay plans without an arena as CUDA graphs under the cap, with "
                             "static inputs on the caching allocator (default: eagerly)")
    parser.add_argument("--merge", action="store_true",
                        help="only merge OUT/*/recompute_check.json into OUT (no runs)")
    args = parser.parse_args()
    if args.merge:
        return merge(args.out)
    DEV, SLACK_MIB, STATIC_REPLAY = args.device, args.slack_mib, args.static_replay
    if DEV.startswith("cuda") and not torch.cuda.is_available():
        print("error: no CUDA device", file=sys.stderr)
        return 2
    if DEV.startswith("cuda"):
        configure_cuda(deterministic=False)
    else:
        args.no_native = True  # native_compare runs on cuda:0 only
    args.out.mkdir(parents=True, exist_ok=True)
    clock = Clock(args.budget_s)
    meta = {"device": torch.cuda.get_device_name(0) if DEV.startswith("cuda") else DEV,
            "torch": torch.__version__,
            "host": platform.node(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "iterations": args.iterations, "warmup": args.warmup,
            "cap": f"budget + {SLACK_MIB} MiB (expandable segments); autotm run: + 64 MiB"}
    rows: list[dict[str, Any]] = []
    doc = {"format": "autotm-recompute-check", "version": 1, "meta": meta, "rows": rows}
    models: list[Model] = []
    for name in args.models.split(","):
        plans = load_plans(args.plans, name, args.match)
        if not plans:
            print(f"{name}: no plans in {args.plans}", flush=True)
            continue
        models.append(Model(name, plans))
        rows.append(models[-1].row)
    for task in tasks(models, args):
        try:
            run_task(task, args, clock)
        except Exception:  # (keep the other measurements)
            error = traceback.format_exc(limit=3)[-1500:]
            task[1].row.setdefault("errors", []).append(error)
            print(error, flush=True)
        doc["skipped"] = clock.skipped
        doc["wall_s"] = time.perf_counter() - clock.start
        (args.out / "recompute_check.json").write_text(json.dumps(doc, indent=1))
    write_table(args.out, rows)
    medians = [c for r in rows for c in r["budgets"].values()]
    print(f"{len(rows)} models, {len(medians)} budgets in {doc.get('wall_s', 0):.0f} s; "
          f"skipped: {clock.skipped or 'nothing'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
