"""Summarize a GPU benchmark (`autotm bench --device cuda --execute`) against the targets of
the GPU issue, as the Markdown tables of docs/gpu.md:

    python experiments/gpu/summarize.py experiments/results/gpu_h100.json

(or its CSV, where the JSON did not come back from the GPU machine).

Per row: predicted and measured time of the plan, against our all-fast iteration (replayed
where the sweep ran with --graph), native eager (torch.autograd of the same graph, uncapped),
PyTorch activation checkpointing under the same cap, the capped baselines, the transfer lower
bound, the headroom the plan needed, and the measured (and reserved) peak against the budget.
Then the targets: AutoTM-async and the joint plans against all-fast per budget (geometric
means), the best plan against the best baseline that fits at each budget, the median
prediction error, and the peaks.
"""

from __future__ import annotations

import argparse
import statistics

from autotm_py.bench import read_result
from autotm_py.errors import ConfigError
from autotm_py.units import parse_ratio

# Measured baselines that run under the same cap as the plans (torch's own run uncapped, so
# save_on_cpu counts only where its measured peak is within the budget).
CAPPED_BASELINES = ("first_touch", "lru", "offload")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="the CSV or JSON that `autotm bench -o` wrote")
    try:
        rows = [r for r in read_result(parser.parse_args().results) if r.get("measured_s")]
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(table(rows))
    print()
    print(targets(rows))


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.0f}"


def best_baseline(row: dict) -> tuple[str | None, float | None]:
    """The fastest measured baseline that fits the budget: the capped baselines, PyTorch
    activation checkpointing under the same cap, save_on_cpu where its peak fits."""
    options = {name: row.get(f"measured_{name}_s") for name in (*CAPPED_BASELINES,
                                                                "checkpoint")}
    peak = row.get("measured_save_on_cpu_peak_bytes")
    if peak is not None and peak <= row["budget_bytes"]:
        options["save_on_cpu"] = row.get("measured_save_on_cpu_s")
    options = {k: v for k, v in options.items() if v}
    if not options:
        return None, None
    name = min(options, key=options.__getitem__)
    return name, options[name]


def mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}"


def times(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.2f}x"


def table(rows: list[dict]) -> str:
    head = ("| model | budget | plan | headroom | predicted ms | measured ms | x all-fast | "
            "all-fast | native eager (uncapped) | checkpointing (segments) | first-touch | "
            "LRU | offload | save_on_cpu (uncapped) | bound | peak / reserved / budget MiB | "
            "retries |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        segments = r.get("checkpoint_segments")
        checkpoint = ms(r.get("measured_checkpoint_s")) + (f" ({segments})" if segments else "")
        plan = r["strategy"] + (f" [{r['options']}]" if r.get("options") else "")
        lines.append(
            f"| {r['model']} b{r['batch']} | {budget_share(r['ratio'])} | "
            f"{plan} | {r.get('headroom') or 0:.2f} | {ms(r['predicted_s'])} | "
            f"{ms(r['measured_s'])} | {times(r['measured_s'], r.get('measured_all_fast_s'))} | "
            f"{ms(r.get('measured_all_fast_s'))} | {ms(r.get('measured_torch_autograd_s'))} | "
            f"{checkpoint} | "
            f"{ms(r.get('measured_first_touch_s'))} | {ms(r.get('measured_lru_s'))} | "
            f"{ms(r.get('measured_offload_s'))} | {ms(r.get('measured_save_on_cpu_s'))} | "
            f"{ms(r.get('transfer_bound_s'))} | {mib(r['measured_peak_fast_bytes'])} / "
            f"{mib(r.get('measured_reserved_peak_bytes'))} / {mib(r['budget_bytes'])} | "
            f"{r.get('measured_alloc_retries', '-')} |")
    return "\n".join(lines)


def targets(rows: list[dict]) -> str:
    out = []
    half = [r for r in rows if r["ratio"] == "1:1" and r["strategy"] == "async"]
    if half:
        ratio = statistics.geometric_mean(r["measured_s"] / r["measured_all_fast_s"] for r in half)
        bound = statistics.geometric_mean(r["transfer_bound_s"] / r["measured_all_fast_s"]
                                          for r in half)
        out.append(f"- async at 50% vs all-fast: geometric mean {ratio:.2f}x over {len(half)} "
                   f"models (target 1.15x); the transfer bound alone is {bound:.2f}x")
    by_share = sorted({r["ratio"] for r in rows}, key=lambda r: parse_ratio(r).fast_fraction,
                      reverse=True)
    joint = [r for r in rows if r["strategy"].endswith("+recompute")
             and r.get("measured_all_fast_s")]
    for ratio in by_share:
        group = [r for r in joint if r["ratio"] == ratio]
        if group:
            mean = statistics.geometric_mean(r["measured_s"] / r["measured_all_fast_s"]
                                             for r in group)
            out.append(f"- joint plans at {budget_share(ratio)} vs all-fast: geometric mean "
                       f"{mean:.2f}x over {len(group)} models ("
                       + ", ".join(f"{r['model']} {r['measured_s'] / r['measured_all_fast_s']:.2f}x"
                                   for r in group) + ")")
    versus = []
    for r in joint:
        others = [o for o in rows if (o["model"], o["ratio"]) == (r["model"], r["ratio"])
                  and o["strategy"] in ("async", "sync", "recompute-only")]
        versus += [f"{r['model']} {budget_share(r['ratio'])}: "
                   f"{o['measured_s'] / r['measured_s']:.2f}x faster than {o['strategy']}"
                   for o in others]
    if versus:
        out.append("- joint plans vs move-only and recompute-only plans of the same cell: "
                   + "; ".join(versus))
    out.append("- best plan vs the best baseline that fits (capped baselines, checkpointing "
               "under the cap, save_on_cpu where its peak fits), per budget:")
    for ratio in by_share:
        cells = []
        for model in dict.fromkeys(r["model"] for r in rows):
            group = [r for r in rows if r["model"] == model and r["ratio"] == ratio]
            if not group:
                continue
            best = min(group, key=lambda r: r["measured_s"])
            name, base = best_baseline(best)
            if base:
                cells.append(f"{model} {base / best['measured_s']:.2f}x ({best['strategy']} "
                             f"vs {name})")
        out.append(f"  - {budget_share(ratio)}: " + "; ".join(cells))
    errors = [abs(r["predicted_s"] - r["measured_s"]) / r["measured_s"] for r in rows]
    out.append(f"- median |predicted - measured| / measured: {statistics.median(errors):.1%} "
               f"over {len(errors)} runs (max {max(errors):.1%})")
    over = [r for r in rows if r["measured_peak_fast_bytes"] > r["budget_bytes"]]
    out.append(f"- measured peak above the budget: {len(over)} of {len(rows)} runs")
    reserved = [r for r in rows if r.get("measured_reserved_peak_bytes") is not None]
    if reserved:
        above = [r for r in reserved if r["measured_reserved_peak_bytes"] > r["budget_bytes"]]
        out.append(f"- reserved peak above the budget: {len(above)} of {len(reserved)} runs; "
                   f"allocator retries: {sum(r.get('measured_alloc_retries') or 0 for r in rows)}")
    out += busy_lines(rows)
    return "\n".join(out)


def busy_lines(rows: list[dict]) -> list[str]:
    """Issue 14 item 4: replayed iterations against the GPU's own work in them (the union
    of kernels, copies and memsets of one profiled replay, `runtime.device_trace`)."""
    plans = [(f"{r['model']} {budget_share(r['ratio'])} {r['strategy']}",
              r["measured_s"] / r["measured_device_busy_s"])
             for r in rows if r.get("measured_device_busy_s")]
    spans = [r["measured_device_span_s"] / r["measured_device_busy_s"]
             for r in rows if r.get("measured_device_span_s") and r.get("measured_device_busy_s")]
    all_fast = {r["model"]: r["measured_all_fast_s"] / r["measured_all_fast_device_busy_s"]
                for r in rows if r.get("measured_all_fast_device_busy_s")}
    out = []
    if all_fast:
        out.append("- all-fast replays / device busy time: " + ", ".join(
            f"{m} {x:.3f}x" for m, x in all_fast.items()) + " (target 1.05x)")
    if plans:
        worst = max(plans, key=lambda p: p[1])
        out.append(f"- plan replays / device busy time: median "
                   f"{statistics.median(x for _, x in plans):.3f}x over {len(plans)} runs, "
                   f"largest {worst[1]:.3f}x ({worst[0]}); over 1.05x: "
                   f"{sum(x > 1.05 for _, x in plans)}")
    if spans:
        out.append(f"- profiled replay's span / its busy time: median "
                   f"{statistics.median(spans):.3f}x over {len(spans)} runs, largest "
                   f"{max(spans):.3f}x")
    return out


def budget_share(ratio: str) -> str:
    """The budget as a share of the peak: "1:3" -> "25%"."""
    return f"{float(parse_ratio(ratio).fast_fraction):.0%}"


if __name__ == "__main__":
    main()
