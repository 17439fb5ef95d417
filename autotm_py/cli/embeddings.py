"""`autotm embeddings MODEL --budget ...`: embedding tables placed at row blocks (hot blocks in
HBM, cold ones read zero-copy from pinned host memory or copied ahead of their batch), the ILP
against hot-first greedy, an LRU row cache, all-host and all-HBM, per budget
(docs/embeddings.md)."""

from __future__ import annotations

from typing import Any

import click

from autotm_py import api
from autotm_py.cli import cli
from autotm_py.cli.common import json_option, print_json
from autotm_py.errors import ConfigError
from autotm_py.units import format_bytes, parse_bytes

NAMES = ("ilp", "greedy", "lru", "all-host", "all-hbm")


def parse_budgets(text: str, table_bytes: int) -> list[int]:
    """'10%,50%' (shares of the tables' bytes) or '4GiB,16GiB', comma-separated."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if part.endswith("%"):
            try:
                share = float(part[:-1]) / 100
            except ValueError:
                raise ConfigError(f"--budget {part!r}: expected a share like 10%") from None
            out.append(int(share * table_bytes))
        else:
            out.append(parse_bytes(part, flag="--budget"))
    return out


@cli.command("embeddings")
@click.argument("model", default="dlrm")
@click.option("--budget", default="1%,10%,25%,50%,100%", show_default=True,
              help="HBM budgets, comma-separated: shares of the tables' bytes (10%) or sizes "
                   "(4GiB); the dense part's memory comes out of each.")
@click.option("--zipf", "alpha", type=click.FloatRange(min=0), default=1.05, show_default=True,
              help="Row popularity: Zipf exponent of the generated lookups.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--trace", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Lookups from an .npz (one index array per table) instead of --zipf.")
@click.option("--block-rows", type=click.IntRange(min=1), default=4096, show_default=True,
              help="Rows per block, the unit of placement.")
@click.option("--dim", type=click.IntRange(min=1), default=128, show_default=True,
              help="dlrm: embedding width.")
@click.option("--table-scale", type=click.IntRange(min=1), default=2, show_default=True,
              help="dlrm: rows of the Kaggle tables times this (x2, dim 128: 34.6 GB).")
@click.option("--batch", "-b", type=click.IntRange(min=1), default=None,
              help="Samples per batch [default: 2048, or the workload file's].")
@click.option("--pooling", type=click.IntRange(min=1), default=None,
              help="Lookups per sample and table [default: 1].")
@click.option("--memory", default="h200-pcie5", show_default=True,
              help="Memory-system preset or file whose link prices host reads and copies.")
@click.option("--profile-batches", type=click.IntRange(min=1), default=32, show_default=True,
              help="Batches whose counts the plan is made from.")
@click.option("--held-batches", type=click.IntRange(min=1), default=8, show_default=True,
              help="Batches after them on which every placement is priced.")
@click.option("--ranked", is_flag=True,
              help="Zipf rank = row id (rows renumbered offline) instead of scattered rows.")
@click.option("--no-copy-ahead", is_flag=True, help="Blocks are resident or zero-copy only.")
@click.option("--no-lru", is_flag=True, help="Skip the LRU cache (slow on big budgets).")
@click.option("--time-limit", type=click.FloatRange(min=0, min_open=True), default=30.0,
              show_default=True, help="Seconds per ILP solve.")
@json_option
def embeddings(model: str, budget: str, alpha: float, seed: int, trace: str | None,
               block_rows: int, dim: int, table_scale: int, batch: int | None,
               pooling: int | None, memory: str, profile_batches: int, held_batches: int,
               ranked: bool, no_copy_ahead: bool, no_lru: bool, time_limit: float,
               as_json: bool) -> None:
    """Place MODEL's embedding tables (dlrm, or a workload JSON) at row blocks for each budget;
    print the predicted time per batch of each placement."""
    workload = api.embedding_workload(model, dim=dim, table_scale=table_scale, batch=batch,
                                      pooling=pooling, block_rows=block_rows)
    budgets = parse_budgets(budget, workload.table_bytes)
    result = api.plan_embeddings(
        workload, budgets, alpha=alpha, seed=seed, trace=trace, memory=memory,
        profile_batches=profile_batches, held_batches=held_batches,
        copy_ahead=not no_copy_ahead, time_limit=time_limit, with_lru=not no_lru,
        scatter=not ranked)
    if as_json:
        print_json(result)
        return
    for line in summary(result):
        click.echo(line)


def summary(result: dict[str, Any]) -> list[str]:
    w = result["workload"]
    lines = [
        f"workload  {w['name']}: {w['tables']} tables, {w['rows'] / 1e6:.1f}M rows, "
        f"{format_bytes(w['table_bytes'])}; batch {w['batch']} x {w['pooling']} lookups per "
        f"table; {w['blocks']} blocks of {w['block_rows']} rows; dense part "
        f"{format_bytes(w['dense_bytes'])}",
        f"skew      {result['skew']}: the hottest 10% of the bytes (by the profile's "
        f"counts) serve {100 * result['hot_10pct_share']:.1f}% of the held-out lookups",
        f"priced    {result['memory']}: planned on {result['profile_batches']} batches, "
        f"times on the {result['held_batches']} after them (ms per batch)", ""]
    head = ["budget", "share", *NAMES, "ILP blocks hbm/copy", "ILP vs LRU"]
    table = [head]
    for b in result["budgets"]:
        rows = {r["name"]: r for r in b["rows"]}
        times = [f"{rows[n]['batch_ms']:.4f}" if rows.get(n, {}).get("fits") else "-"
                 for n in NAMES]
        ilp, lru = rows["ilp"], rows.get("lru")
        blocks = f"{ilp['blocks']['hbm']}/{ilp['blocks']['copy']}" if ilp["fits"] else \
            ilp["status"]
        ratio = f"{lru['batch_ms'] / ilp['batch_ms']:.2f}x" if lru and ilp["fits"] else "-"
        table.append([format_bytes(b["budget_bytes"]), f"{100 * b['share']:.1f}%", *times,
                      blocks, ratio])
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines += ["  ".join(c.rjust(wd) for c, wd in zip(r, widths, strict=True)) for r in table]
    return lines
