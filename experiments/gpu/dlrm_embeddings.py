"""DLRM inference with its embedding tables placed at row blocks, measured across HBM budgets
(issue 48 item 4; docs/embeddings.md).

The zoo's DLRM (Criteo Kaggle tables x --table-scale, --dim wide: 34.6 GB at the defaults; the
zoo's MLPs, widened to --dim) runs inference batches whose lookups come from a seeded Zipf law
(--zipf, --seed; the skew is written with the results). For each share of the tables' bytes
(--shares, 10% to 100%), the block-placement ILP plans from the counts of --profile-batches
batches, and these run on the batches after them, each measured as lookup + MLP latency and
throughput:
- ilp: resident blocks in HBM, zero-copy blocks read over PCIe from pinned host memory (the
  pinned tensor aliased as a device tensor), copy-ahead blocks gathered on the host and copied
  ahead of their batch on a side stream;
- lru: an LRU row cache of the same bytes in HBM, warmed on the profile batches; misses read
  zero-copy and written into the cache. Its bookkeeping (which rows hit, which slot a miss
  takes) is computed before the timed loop, so only its fills and reads are timed: a lower
  bound on an LRU cache's time;
- all-host: every row read zero-copy (UVM-style, no cache), once;
- all-hbm: every row in HBM, once, where it fits.
Placements are looked up in one pass over a unified view of both tiers; one with both HBM and
zero-copy blocks is also timed with the padded per-tier lookup (`padded` in its row), and
every placement row has its lookup's kernels' device times (`lookup_kernels_us`); a probe of
one embedding_bag over the host table, indices at a pad row or not (`pad_probe_ms`), says
what pad reads cost (docs/embeddings.md, "Why the placements got slower").

The comparison is meant to be fair. Every configuration runs the same MLPs on the same inputs
with the same call (`mlp_ms_median` times them alone), its indices and offsets already on the
device, a device synchronization before and after each batch. None pays per batch for host
work that a deployment would do once: the LRU's bookkeeping is precomputed (above), and the
placed tables' block -> (tier, slot) maps are device tensors built at placement time, their
batch layout at the first (warm-up) batch, so a placed lookup is a fixed number of device
kernels with no host synchronization (checked: `lookup_sync_free`). Where a placement copies
blocks ahead, batch k+1's host gather and copy are issued after batch k's kernels, on a side
stream, and count only where they outlast them. Each ilp row has the ILP's and hot-first
greedy's times on the profile counts they were planned from (`planned_ms`,
`greedy_planned_ms`; the ILP's is never larger) and on the held-out batches (`predicted_ms`,
`greedy_predicted_ms`).

    python3 experiments/gpu/dlrm_embeddings.py OUT_DIR [--small] [--shares 0.1,0.25,0.5,0.75,1]
        [--zipf 1.05] [--seed 0] [--ranked] [--batch 2048] [--dim 128] [--table-scale 2]
        [--block-rows 4096] [--iterations 20] [--time-limit 30]

Writes OUT_DIR/dlrm_embeddings.json (and .png where matplotlib is installed), nothing else,
and prints a table. First, on the device, tiny tables under five placements are looked up and
compared with torch.nn.functional.embedding_bag (`self_check` in the JSON), and a placed lookup
runs under torch.cuda.set_sync_debug_mode("error") (`lookup_sync_free`). `--small` runs tiny
tables on the CPU (every tier a CPU tensor): a smoke test of the script, whose times mean
nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from autotm_py import api
from autotm_py.frontend.zoo.dlrm import BOTTOM_MLP, KAGGLE_TABLES, TOP_HIDDEN
from autotm_py.memory.tiers import load_memory_system
from autotm_py.planning.embedding_access import EmbeddingTable, EmbeddingWorkload
from autotm_py.planning.embedding_study import describe, make_lookups
from autotm_py.planning.embeddings import (
    HBM,
    HOST,
    LookupCosts,
    Placement,
    greedy,
    predict,
    solve_placement,
)
from autotm_py.runtime.embedding_bag import PlacedTables, pinned_empty, zero_copy_view


def small_workload() -> EmbeddingWorkload:
    tables = tuple(EmbeddingTable(f"emb.{i}", max(rows // 2000, 8), 16)
                   for i, rows in enumerate(KAGGLE_TABLES))
    return EmbeddingWorkload("dlrm-small (Kaggle rows / 2000, dim 16)", tables, batch=64,
                             block_rows=16, dense_bytes=0)


class DenseDLRM(torch.nn.Module):
    """The zoo DLRM's MLPs and dot interaction, the bottom MLP ending at the tables' width."""

    def __init__(self, dim: int, tables: int) -> None:
        super().__init__()
        bottom = (*BOTTOM_MLP[:-1], dim)
        pairs = (tables + 1) * tables // 2
        self.bottom = _mlp(bottom, last_relu=True)
        self.top = _mlp((dim + pairs, *TOP_HIDDEN, 2), last_relu=False)
        self.register_buffer("lower", torch.tril_indices(tables + 1, tables + 1, -1))

    def forward(self, dense: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
        x = self.bottom(dense)
        stacked = torch.stack([x, *pooled], dim=1)
        dots = torch.bmm(stacked, stacked.transpose(1, 2))
        return self.top(torch.cat([x, dots[:, self.lower[0], self.lower[1]]], dim=1))


def _mlp(sizes: tuple[int, ...], last_relu: bool) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if last_relu or i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class LruCache:
    """An LRU row cache in HBM: slots of rows, bookkeeping on the host (precomputed)."""

    def __init__(self, tables: PlacedTables, capacity_rows: int) -> None:
        self.tables, self.capacity = tables, max(capacity_rows, 0)
        self.rows = torch.empty(self.capacity, tables.dim, device=tables.device)
        self.slot_of: OrderedDict[int, int] = OrderedDict()
        self.free = list(range(self.capacity - 1, -1, -1))

    def plan(self, batch: list[np.ndarray]) -> tuple[Any, ...]:
        """(host rows to fill, their slots, each index's slot) of one batch; LRU order kept."""
        starts = np.cumsum([0, *self.tables.rows[:-1]])
        keys = np.concatenate([ix + s for ix, s in zip(batch, starts, strict=True)])
        fill_rows, fill_slots = [], []
        for key in np.unique(keys).tolist():
            if key in self.slot_of:
                self.slot_of.move_to_end(key)
                continue
            if not self.free:
                _, slot = self.slot_of.popitem(last=False)
                self.free.append(slot)
            slot = self.free.pop()
            self.slot_of[key] = slot
            fill_rows.append(key)
            fill_slots.append(slot)
        slots = np.fromiter((self.slot_of[k] for k in keys.tolist()), dtype=np.int64,
                            count=len(keys))
        dev = self.tables.device
        return (torch.as_tensor(fill_rows, dtype=torch.long).to(dev),
                torch.as_tensor(fill_slots, dtype=torch.long).to(dev),
                torch.as_tensor(slots).to(dev))

    def lookup(self, planned: tuple[Any, ...], offsets: list[torch.Tensor],
               per_table: int) -> list[Any]:
        """The fills (zero-copy reads written into the cache), then the bags pooled from the
        cache rows by one embedding_bag: the same pooling as `PlacedTables.lookup`'s."""
        fill_rows, fill_slots, slots = planned
        if len(fill_rows):
            self.rows[fill_slots] = self.tables.host_view.index_select(0, fill_rows)
        lay = self.tables.layout([per_table] * len(offsets), [len(o) for o in offsets])
        bags = torch.cat(offsets) + lay.bag_shift
        pooled = F.embedding_bag(slots, self.rows, bags, mode="sum")
        return list(pooled.split(list(lay.bags)))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def inputs(workload: EmbeddingWorkload, held: list, iterations: int, device: torch.device,
           seed: int) -> list[dict[str, Any]]:
    """Per timed iteration: the dense features, each table's indices (host and device) and
    bag offsets (one bag of `pooling` indices per sample)."""
    gen = torch.Generator().manual_seed(seed)
    n, p = workload.lookups_per_batch, workload.pooling
    offsets = torch.arange(0, n, p, device=device)
    out = []
    for it in range(iterations):
        batch = held[it % len(held)]
        host = [torch.as_tensor(ix) for ix in batch]
        out.append({"dense": torch.randn(workload.batch, BOTTOM_MLP[0], generator=gen).to(device),
                    "host": host, "device": [ix.to(device) for ix in host],
                    "offsets": [offsets] * len(batch), "numpy": batch})
    return out


def time_loop(step: Any, batches: list[dict[str, Any]], device: torch.device,
              warmup: int) -> dict[str, float]:
    """Run `step(k)` for every batch; per-batch latency (median, p90) and throughput over the
    timed ones."""
    times = []
    for k in range(len(batches)):
        sync(device)
        started = time.perf_counter()
        step(k)
        sync(device)
        if k >= warmup:
            times.append(time.perf_counter() - started)
    times.sort()
    batch = len(batches[0]["dense"])
    return {"latency_ms_median": 1e3 * statistics.median(times),
            "latency_ms_p90": 1e3 * times[int(0.9 * (len(times) - 1))],
            "throughput_samples_s": batch * len(times) / sum(times), "timed": len(times)}


def time_graphed(step: Any, batches: list[dict[str, Any]], device: torch.device,
                 warmup: int) -> dict[str, float]:
    """`time_loop` of each batch's `step` captured into a CUDA graph of its own (after one
    eager step, which makes the lookup's cached layout): the latency without the host's
    per-op launch costs, which in eager steps (15-40 small kernels a batch, the lookup's
    device time 0.08-0.5 ms) make the host the bottleneck and bury the placement's effect.
    The same as `time_loop` where graphs cannot be made (the CPU)."""
    if device.type != "cuda":
        return time_loop(step, batches, device, warmup)
    step(0)
    sync(device)
    graphs = []
    for k in range(len(batches)):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step(k)
        graphs.append(graph)
    return time_loop(lambda k: graphs[k].replay(), batches, device, warmup)


def run_placed(tables: PlacedTables, model: DenseDLRM, batches: list[dict[str, Any]],
               warmup: int, padded: bool = False, graphed: bool = False) -> dict[str, float]:
    """Lookup + MLPs per batch, launched (device kernels only, nothing waits), then, while
    they run, the next batch's copy-ahead rows gathered on the host and copied on a side
    stream; a placement without copy-ahead blocks does no per-batch host work at all."""
    device = tables.device
    copying = tables.copies_ahead
    stream = torch.cuda.Stream(device) if device.type == "cuda" and copying else None
    staged: list[Any] = [None] * len(batches)
    staged[0] = tables.prefetch(batches[0]["host"])

    def step(k: int) -> None:
        if stream is not None:
            current = torch.cuda.current_stream(device)
            current.wait_stream(stream)  # batch k's staged rows, copied on the side stream
            staged[k].rows.record_stream(current)
            staged[k].slots.record_stream(current)
        b = batches[k]
        with torch.no_grad():
            model(b["dense"], tables.lookup(b["device"], b["offsets"], staged=staged[k],
                                            padded=padded))
        staged[k] = None
        if copying and k + 1 < len(batches):  # overlaps batch k on the device
            if stream is None:
                staged[k + 1] = tables.prefetch(batches[k + 1]["host"])
            else:
                with torch.cuda.stream(stream):
                    staged[k + 1] = tables.prefetch(batches[k + 1]["host"])

    if graphed and not copying:  # copy-ahead rows are gathered on the host: not capturable
        return time_graphed(step, batches, device, warmup)
    return time_loop(step, batches, device, warmup)


def time_mlp(model: DenseDLRM, batches: list[dict[str, Any]], tables: int, dim: int,
             device: torch.device, warmup: int, graphed: bool = False) -> dict[str, float]:
    """The MLPs and interaction alone, on pooled rows of zeros: the part of every
    configuration's time that is not the lookup (the same model, inputs and call for all)."""
    pooled = [torch.zeros(len(batches[0]["dense"]), dim, device=device)] * tables

    def step(k: int) -> None:
        with torch.no_grad():
            model(batches[k]["dense"], pooled)

    return (time_graphed if graphed else time_loop)(step, batches, device, warmup)


def run_lru(cache: LruCache, model: DenseDLRM, batches: list[dict[str, Any]],
            warmup: int, per_table: int, graphed: bool = False) -> dict[str, float]:
    planned = [cache.plan(b["numpy"]) for b in batches]  # bookkeeping, not timed

    def step(k: int) -> None:
        b = batches[k]
        with torch.no_grad():
            model(b["dense"], cache.lookup(planned[k], b["offsets"], per_table))

    if graphed:  # the cache's rows refilled by the captured fills, in batch order again
        return time_graphed(step, batches, cache.tables.device, warmup)
    return time_loop(step, batches, cache.tables.device, warmup)


def sync_free(device: torch.device, seed: int) -> bool | None:
    """Whether a placed lookup (all tiers, the layout already made) runs without any
    device-to-host synchronization: run under torch.cuda.set_sync_debug_mode("error"), which
    raises at any synchronizing call (None on the CPU, where nothing can be checked)."""
    if device.type != "cuda":
        return None
    w = small_workload()
    rng = np.random.default_rng(seed)
    where = [rng.integers(0, 3, w.blocks_of(i)).astype(np.int8) for i in range(len(w.tables))]
    tables = PlacedTables.uninitialized([t.rows for t in w.tables], w.tables[0].dim, where,
                                        w.block_rows, device)
    host = [torch.as_tensor(rng.integers(0, t.rows, w.batch)) for t in w.tables]
    batch = [ix.to(device) for ix in host]
    offsets = [torch.arange(w.batch, device=device)] * len(w.tables)
    staged = tables.prefetch(host)
    tables.lookup(batch, offsets, staged=staged)  # the layout, made once
    sync(device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        tables.lookup(batch, offsets, staged=staged)
    except RuntimeError as exc:
        print(f"the placed lookup synchronizes: {exc}", file=sys.stderr)
        return False
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return True


def self_check(device: torch.device, seed: int) -> bool:
    """The placed lookups on `device` (zero-copy host reads included) equal embedding_bag on
    the whole tables, for tiny tables under all-host, all-HBM, all-copy and random placements."""
    w = small_workload()
    gen = torch.Generator().manual_seed(seed)
    weights = [torch.randn(t.rows, t.dim, generator=gen) for t in w.tables]
    rng = np.random.default_rng(seed)
    nb = [w.blocks_of(i) for i in range(len(w.tables))]
    batch = [torch.as_tensor(rng.integers(0, t.rows, 3 * w.batch)) for t in w.tables]
    offsets = [torch.arange(0, 3 * w.batch, 3)] * len(w.tables)
    placements = [[np.full(n, code, dtype=np.int8) for n in nb] for code in (0, 1, 2)]
    placements += [[rng.integers(0, 3, n).astype(np.int8) for n in nb] for _ in range(2)]
    on_device = [ix.to(device) for ix in batch], [o.to(device) for o in offsets]
    for where in placements:
        tables = PlacedTables.from_weights(weights, where, w.block_rows, device)
        for padded in (False, True):  # the unified lookup, and the per-tier one
            got = tables.lookup(*on_device, staged=tables.prefetch(batch), padded=padded)
            for g, wt, ix, o in zip(got, weights, batch, offsets, strict=True):
                if not torch.allclose(g.cpu(), F.embedding_bag(ix, wt, o, mode="sum"),
                                      atol=1e-5):
                    return False
    cache = LruCache(tables, sum(t.rows for t in w.tables) // 3)  # the LRU path, the same way
    for _ in range(2):
        got = cache.lookup(cache.plan([ix.numpy() for ix in batch]),
                           [o.to(device) for o in offsets], 3 * w.batch)
        for g, wt, ix, o in zip(got, weights, batch, offsets, strict=True):
            if not torch.allclose(g.cpu(), F.embedding_bag(ix, wt, o, mode="sum"), atol=1e-5):
                return False
    return True


def measure_placement(name: str, share: float, where: list[np.ndarray], context: dict,
                      **extra: Any) -> dict[str, Any]:
    """Lookup + MLPs per batch with the unified lookup (`unified`: whether the placement's
    view over both tiers was made); a placement with both HBM and zero-copy blocks is also
    timed with the per-tier padded lookup (`padded`: the first executor's, for comparison)."""
    w, model, batches = context["workload"], context["model"], context["batches"]
    tables = PlacedTables.uninitialized([t.rows for t in w.tables], w.tables[0].dim, where,
                                        w.block_rows, context["device"], host=context["host"])
    row = {"name": name, "share": share, **extra, "unified": tables.unified is not None,
           **run_placed(tables, model, batches, context["warmup"]),
           "graphed": run_placed(tables, model, batches, context["warmup"], graphed=True),
           "lookup_kernels_us": lookup_kernels(tables, batches)}
    if {HBM, HOST} <= tables.tiers:
        row["padded"] = {**run_placed(tables, model, batches, context["warmup"], padded=True),
                         "lookup_kernels_us": lookup_kernels(tables, batches, padded=True)}
    return row


def lookup_kernels(tables: PlacedTables, batches: list[dict[str, Any]],
                   padded: bool = False) -> dict[str, float] | None:
    """Device time per lookup (us, the mean over 5 batches) of each kernel the lookup runs,
    by name, from torch.profiler: where a lookup's time goes (None on the CPU, or where the
    profiler records no device activity)."""
    if tables.device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for b in batches[:5]:
                staged = tables.prefetch(b["host"])
                tables.lookup(b["device"], b["offsets"], staged=staged, padded=padded)
            sync(tables.device)
    except Exception as exc:
        print(f"lookup kernel profile failed: {exc}", file=sys.stderr)
        return None
    out: dict[str, float] = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
        if us and e.key and not e.key.startswith(("aten::", "cudaDevice", "Memcpy")):
            out[e.key[:80]] = out.get(e.key[:80], 0.0) + us / 5
    return out or None


def pad_probe(context: dict) -> dict[str, float] | None:
    """What one embedding_bag over a batch's lookups (every table's, one row a bag) costs,
    median ms by CUDA events, when its indices are: `host_pad_P`, P% at one host row given as
    padding_idx and the rest at random host rows (the padded lookup's host-tier kernel when P%
    of the lookups are served from HBM); `host_one_row`, all at that row without padding_idx;
    `host_spread`, all at random host rows (all-host); `hbm_one_row`, all at one HBM row. If
    pads were skipped, host_pad_100 would cost what hbm_one_row does. None on the CPU."""
    device = context["device"]
    if device.type != "cuda":
        return None
    w = context["workload"]
    n, host = w.lookups_per_batch * len(w.tables), context["host"]
    view = zero_copy_view(host, device)
    hbm = torch.zeros(1024, host.shape[1], device=device)
    bags = torch.arange(n, device=device)
    gen = torch.Generator().manual_seed(context["seed"])
    pad = host.shape[0] // 2
    spread = torch.randint(0, host.shape[0], (n,), generator=gen)
    draw = torch.rand(n, generator=gen)
    cases = {f"host_pad_{p}": (view, torch.where(draw < p / 100, pad, spread).to(device), pad)
             for p in (90, 99, 100)}
    cases.update({"host_one_row": (view, torch.full((n,), pad, device=device), None),
                  "host_spread": (view, spread.to(device), None),
                  "hbm_one_row": (hbm, torch.zeros(n, dtype=torch.long, device=device), None)})
    out = {}
    for name, (weight, idx, padding_idx) in cases.items():
        times = []
        for k in range(context["warmup"] + 10):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                enable_timing=True)
            start.record()
            F.embedding_bag(idx, weight, bags, mode="sum", padding_idx=padding_idx)
            stop.record()
            stop.synchronize()
            if k >= context["warmup"]:
                times.append(start.elapsed_time(stop))
        out[name] = statistics.median(times)
    return out


def measure_lru(share: float, context: dict) -> dict[str, Any]:
    w = context["workload"]
    capacity = int(share * w.table_bytes) // w.tables[0].row_bytes
    widest = max(len(np.unique(np.concatenate([ix + k * (1 << 40) for k, ix in
                                               enumerate(b)])))
                 for b in context["profile"] + context["held"])
    if capacity < widest:
        return {"name": "lru", "share": share, "skipped": f"{capacity} rows hold less than "
                f"one batch's {widest} distinct rows"}
    tables = PlacedTables.uninitialized([t.rows for t in w.tables], w.tables[0].dim,
                                        [np.zeros(w.blocks_of(i), dtype=np.int8)
                                         for i in range(len(w.tables))],
                                        w.block_rows, context["device"], host=context["host"])
    cache = LruCache(tables, capacity)
    for batch in context["profile"]:  # warmed on the batches the ILP was planned from
        cache.plan(batch)
    args = (cache, context["model"], context["batches"], context["warmup"],
            w.lookups_per_batch)
    return {"name": "lru", "share": share, "hbm_bytes": capacity * w.tables[0].row_bytes,
            **run_lru(*args), "graphed": run_lru(*args, graphed=True)}


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--shares", default="0.1,0.25,0.5,0.75,1.0")
    ap.add_argument("--zipf", type=float, default=1.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ranked", action="store_true", help="Zipf rank = row id")
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--table-scale", type=int, default=2)
    ap.add_argument("--block-rows", type=int, default=4096)
    ap.add_argument("--profile-batches", type=int, default=32)
    ap.add_argument("--held-batches", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--memory", default="h200-pcie5")
    return ap.parse_args(argv)


def setup(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device("cpu" if args.small or not torch.cuda.is_available() else "cuda")
    workload = small_workload() if args.small else api.embedding_workload(
        "dlrm", dim=args.dim, table_scale=args.table_scale, batch=args.batch,
        block_rows=args.block_rows)
    lookups = make_lookups(workload, alpha=args.zipf, seed=args.seed,
                           profile_batches=args.profile_batches,
                           held_batches=args.held_batches, scatter=not args.ranked)
    torch.manual_seed(args.seed)
    dim, rows = workload.tables[0].dim, sum(t.rows for t in workload.tables)
    model = DenseDLRM(dim, len(workload.tables)).to(device).eval()
    host = pinned_empty(rows, dim) if device.type == "cuda" else torch.empty(rows, dim)
    if args.small:
        host.normal_()
    return {"device": device, "workload": workload, "lookups": lookups, "model": model,
            "host": host, "profile": lookups.profile, "held": lookups.held,
            "batches": inputs(workload, lookups.held, args.warmup + args.iterations, device,
                              args.seed),
            "warmup": args.warmup, "seed": args.seed,
            "costs": LookupCosts.from_memory(load_memory_system(args.memory))}


def main(argv: list[str]) -> int:
    args = parse(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ctx = setup(args)
    checked = self_check(ctx["device"], args.seed)
    no_sync = sync_free(ctx["device"], args.seed)
    print(f"self-check on {ctx['device']}: placed lookups equal embedding_bag: {checked}; "
          f"placed lookup free of device synchronization: {no_sync}", file=sys.stderr)
    w, lookups, costs = ctx["workload"], ctx["lookups"], ctx["costs"]
    rows = []
    host_where = Placement.uniform(w, HOST)
    rows.append(measure_placement("all-host", 0.0, list(host_where.where), ctx,
                                  predicted_ms=1e3 * predict(w, host_where, lookups.held_counts,
                                                             costs).batch_s))
    for share in (float(x) for x in args.shares.split(",")):
        budget = int(share * w.table_bytes) + w.dense_bytes
        result = solve_placement(w, lookups.counts, costs, budget, time_limit=args.time_limit)
        if result.placement is not None:
            p = result.placement
            hot_first = greedy(w, lookups.counts, costs, budget)
            rows.append(measure_placement(
                "ilp", share, list(p.where), ctx, status=result.status, blocks=p.blocks(),
                hbm_bytes=p.resident_bytes(w) + p.staging_bytes(w, lookups.counts),
                predicted_ms=1e3 * predict(w, p, lookups.held_counts, costs).batch_s,
                greedy_predicted_ms=1e3 * predict(w, hot_first, lookups.held_counts,
                                                  costs).batch_s,
                planned_ms=1e3 * (result.objective_s or 0.0),
                greedy_planned_ms=1e3 * (result.greedy_s or 0.0)))
        rows.append(measure_lru(share, ctx))
        print(json.dumps(rows[-1]), file=sys.stderr)
    if ctx["device"].type == "cuda":
        torch.cuda.empty_cache()  # the earlier configurations' blocks, cached
    if ctx["device"].type == "cpu" or torch.cuda.mem_get_info()[0] > 1.2 * w.table_bytes:
        full = Placement.uniform(w, HBM)
        rows.append(measure_placement("all-hbm", 1.0, list(full.where), ctx,
                                      predicted_ms=1e3 * predict(w, full, lookups.held_counts,
                                                                 costs).batch_s))
    probe = pad_probe(ctx)
    mlp = time_mlp(ctx["model"], ctx["batches"], len(w.tables), w.tables[0].dim, ctx["device"],
                   ctx["warmup"])  # last, on a device warmed by the others
    mlp_graphed = time_mlp(ctx["model"], ctx["batches"], len(w.tables), w.tables[0].dim,
                           ctx["device"], ctx["warmup"], graphed=True)
    report = {"workload": describe(w), "skew": lookups.skew,
              "hot_10pct_share": hot_10pct(lookups, w), "device": device_name(ctx["device"]),
              "torch": torch.__version__, "small": args.small, "args": vars(args),
              "self_check": checked, "lookup_sync_free": no_sync,
              "mlp_ms_median": mlp["latency_ms_median"],
              "mlp_graphed_ms_median": mlp_graphed["latency_ms_median"], "pad_probe_ms": probe,
              "rows": rows}
    (out / "dlrm_embeddings.json").write_text(json.dumps(report, indent=2, default=str))
    print_table(report)
    plot(report, out / "dlrm_embeddings.png")
    return 0


def hot_10pct(lookups: Any, workload: EmbeddingWorkload) -> float:
    from autotm_py.planning.embedding_access import hot_share

    return hot_share(lookups.held_counts, workload, 0.10, lookups.counts)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def print_table(report: dict[str, Any]) -> None:
    print(f"{report['workload']['name']} on {report['device']}; skew {report['skew']}: the "
          f"hottest 10% of the bytes (by profile counts) serve "
          f"{100 * report['hot_10pct_share']:.1f}% of the held-out lookups")
    print(f"{'config':>9} {'share':>6} {'predicted ms':>13} {'median ms':>10} {'p90 ms':>8} "
          f"{'samples/s':>12} {'padded median ms':>17} {'graphed median ms':>18}")
    print(f"the MLPs alone (in every row's time): {report['mlp_ms_median']:.3f} ms, graphed "
          f"{report['mlp_graphed_ms_median']:.3f} ms; placed lookup free of device "
          f"synchronization: {report['lookup_sync_free']}")
    for r in report["rows"]:
        if "skipped" in r:
            print(f"{r['name']:>9} {r['share']:>6.2f}  skipped: {r['skipped']}")
            continue
        pred = "-" if r.get("predicted_ms") is None else f"{r['predicted_ms']:.4f}"
        print(f"{r['name']:>9} {r['share']:>6.2f} {pred:>13} "
              f"{r['latency_ms_median']:>10.3f} {r['latency_ms_p90']:>8.3f} "
              f"{r['throughput_samples_s']:>12.0f} "
              f"{r['padded']['latency_ms_median'] if 'padded' in r else float('nan'):>17.3f} "
              f"{r['graphed']['latency_ms_median'] if 'graphed' in r else float('nan'):>18.3f}")
    if report.get("pad_probe_ms"):
        print("one embedding_bag over a batch's lookups (ms): " + ", ".join(
            f"{k} {v:.3f}" for k, v in report["pad_probe_ms"].items()))


def plot(report: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    # graphed (each batch one CUDA graph: the device's time) solid, eager steps faint
    for graphed, alpha, tag in ((True, 1.0, " (graphed)"), (False, 0.35, " (eager)")):
        def latency(r: dict[str, Any], graphed: bool = graphed) -> float | None:
            r = r.get("graphed", {}) if graphed else r
            return r.get("latency_ms_median")

        for name, style in (("ilp", "o-"), ("lru", "s--")):
            pts = [(r["share"], latency(r)) for r in report["rows"]
                   if r["name"] == name and latency(r) is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), style, alpha=alpha, label=name + tag)
        for name, style in (("all-host", ":"), ("all-hbm", "-.")):
            for r in report["rows"]:
                if r["name"] == name and latency(r) is not None:
                    ax.axhline(latency(r), linestyle=style, color="gray", alpha=alpha,
                               label=name + tag)
    ax.set_xlabel("share of the tables' bytes in HBM")
    ax.set_ylabel("lookup + MLP latency per batch (ms)")
    ax.set_title(f"{report['device']}: {report['skew']}", fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
