"""Embedding placement at row blocks (docs/embeddings.md): the access model, the block ILP
against hot-first greedy and an LRU row cache, the executor's lookups, and `autotm
embeddings`."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from autotm_py import api
from autotm_py.cli import _register_commands, cli
from autotm_py.memory.tiers import preset
from autotm_py.planning.embedding_access import (
    BlockCounts,
    EmbeddingTable,
    EmbeddingWorkload,
    count_blocks,
    expected_block_shares,
    zipf_trace,
)
from autotm_py.planning.embedding_cache import LruRowCache, lru_time
from autotm_py.planning.embedding_study import make_lookups
from autotm_py.planning.embeddings import (
    COPY,
    HBM,
    HOST,
    LookupCosts,
    greedy,
    predict,
    solve_placement,
)

COSTS = LookupCosts.from_memory(preset("h200-pcie5"))
ROOT = Path(__file__).resolve().parents[1]


def small(rows=(3000, 700, 50), dim=16, batch=256, block_rows=64, pooling=1, dense=0):
    tables = tuple(EmbeddingTable(f"t{i}", r, dim) for i, r in enumerate(rows))
    return EmbeddingWorkload("small", tables, batch=batch, pooling=pooling,
                             block_rows=block_rows, dense_bytes=dense)


def test_generated_counts_follow_the_zipf_law_and_the_seed():
    w = small(rows=(4096,), batch=2000, block_rows=256)
    trace = zipf_trace(w, alpha=1.1, seed=3, batches=50, scatter=False)
    counts = count_blocks(w, trace)
    measured = counts.accesses[0] / counts.accesses[0].sum()
    expected = expected_block_shares(w, 0, 1.1)
    assert counts.accesses[0].sum() == pytest.approx(2000)  # per batch
    assert np.abs(measured - expected).max() < 0.01
    assert measured[0] == pytest.approx(expected[0], rel=0.03)  # the hot block, 100k draws
    assert (np.diff(measured[:6]) < 0).all()  # hotter first
    again = zipf_trace(w, alpha=1.1, seed=3, batches=2, scatter=False)
    other = zipf_trace(w, alpha=1.1, seed=4, batches=2, scatter=False)
    assert np.array_equal(again[1][0], trace[1][0])
    assert not np.array_equal(other[1][0], trace[1][0])
    uniform = count_blocks(w, zipf_trace(w, alpha=0.0, seed=0, batches=50, scatter=False))
    assert uniform.accesses[0].std() / uniform.accesses[0].mean() < 0.1


def test_scattered_rows_are_renumbered_hottest_first_from_the_profile():
    w = small()
    lookups = make_lookups(w, alpha=1.05, seed=0, profile_batches=8, held_batches=4)
    first = lookups.counts.accesses[0]
    assert first[0] == first.max() and first[0] > 10 * np.median(first)
    # the held-out batches are renumbered by the same map: still hottest first
    assert lookups.held_counts.accesses[0][0] == lookups.held_counts.accesses[0].max()
    assert len(lookups.row_maps) == 3


def test_a_trace_file_is_read_and_renumbered(tmp_path):
    w = small(rows=(500, 90), batch=32)
    rng = np.random.default_rng(0)
    path = tmp_path / "trace.npz"
    np.savez(path, t0=rng.integers(0, 500, 32 * 6), table1=(rng.integers(0, 9, 32 * 6) * 7))
    lookups = make_lookups(w, trace_path=str(path), profile_batches=4, held_batches=2)
    assert lookups.skew.startswith("trace")
    assert lookups.counts.accesses[1][0] == lookups.counts.accesses[1].sum()  # 9 rows, block 0


@pytest.mark.parametrize("share", [0.05, 0.1, 0.3, 1.0])
def test_the_ilp_respects_its_budget_and_is_never_worse_than_greedy_or_lru(share):
    w = small(dense=4096, block_rows=16)
    lookups = make_lookups(w, alpha=1.05, seed=1, profile_batches=16, held_batches=4,
                           scatter=False)
    budget = int(share * w.table_bytes) + w.dense_bytes
    result = solve_placement(w, lookups.counts, COSTS, budget, time_limit=20)
    p = result.placement
    assert p is not None and result.status == "optimal"
    assert p.resident_bytes(w) + p.staging_bytes(w, lookups.counts) <= budget - w.dense_bytes
    planned = predict(w, p, lookups.counts, COSTS)
    assert planned.batch_s == pytest.approx(result.objective_s)
    assert planned.batch_s <= result.greedy_s * (1 + 1e-9)
    held = predict(w, p, lookups.held_counts, COSTS).batch_s
    lru = lru_time(w, lookups.profile, lookups.held, budget - w.dense_bytes, COSTS).batch_s
    assert held <= lru * (1 + 1e-9)
    if share == 1.0:  # every block fits: the blocks the profile never read fill the rest
        assert p.blocks()["hbm"] == sum(w.blocks_of(i) for i in range(3))


def test_the_lru_cache_evicts_the_least_recently_used_rows():
    w = EmbeddingWorkload("w", (EmbeddingTable("t", 100, 4),), batch=2)  # 16-byte rows
    cache = LruRowCache(w, 3 * 16)
    assert list(cache.batch([np.array([1, 2])])[0][0]) == [1, 2]
    cache.batch([np.array([3, 1])])  # 1 used again: 2 is now the oldest
    cache.batch([np.array([4])])  # evicts 2
    missed, hits = cache.batch([np.array([3, 3, 2])])
    assert list(missed[0]) == [2] and list(hits[0]) == [2]  # row 3 hit, twice


def _counts(acc, distinct, peak):
    return BlockCounts((np.array(acc, float),), (np.array(distinct, float),),
                       (np.array(peak),), 1)


def test_copy_ahead_makes_the_optimum_other_than_hot_first_greedy():
    """A hot block bigger than the budget but whose batch reads few distinct rows, many times:
    greedy can place nothing; the ILP copies that block's rows ahead of each batch."""
    w = EmbeddingWorkload("one", (EmbeddingTable("t", 4 * 1024, 128),), batch=1024,
                          block_rows=1024)
    counts = _counts([20000, 300, 100, 0], [60, 200, 80, 0], [64, 220, 90, 0])
    budget = 100 * 512  # less than a block (512 KiB), more than 64 staged rows
    costs = replace(COSTS, launch_s=0.0, chain_s=0.0)  # the row traffic alone (fixed: below)
    result = solve_placement(w, counts, costs, budget)
    assert greedy(w, counts, costs, budget).blocks()["hbm"] == 0
    assert result.placement.where[0][0] == COPY
    assert result.objective_s < 0.5 * result.greedy_s
    without = solve_placement(w, counts, costs, budget, copy_ahead=False)
    assert without.objective_s == pytest.approx(result.greedy_s)
    # with the fixed costs: launches once, and a pass's latency for each of the two passes;
    # here a small batch, so a pass is one step of the kernel
    floor = COSTS.pass_floor(w)
    assert floor == pytest.approx(COSTS.chain_s)  # 1024 bags x 4 chunks: one step of 8192
    priced = solve_placement(w, counts, COSTS, budget)
    plan = priced.placement
    assert plan.where[0][0] == COPY
    assert predict(w, plan, counts, COSTS).lookup_s == pytest.approx(
        predict(w, plan, counts, costs).lookup_s + COSTS.launch_s + 2 * floor)
    assert priced.objective_s == pytest.approx(predict(w, plan, counts, COSTS).batch_s)
    assert priced.objective_s <= priced.greedy_s


def test_a_budget_below_the_dense_part_is_infeasible_and_all_hbm_needs_room():
    w = small(dense=1 << 20)
    lookups = make_lookups(w, alpha=1.0, seed=0, profile_batches=2, held_batches=1)
    assert not solve_placement(w, lookups.counts, COSTS, 1000).feasible
    out = api.plan_embeddings(w, [1000, w.table_bytes + w.dense_bytes], profile_batches=2,
                              held_batches=1)
    rows = [{r["name"]: r for r in b["rows"]} for b in out["budgets"]]
    assert rows[0]["ilp"]["fits"] is False and rows[0]["all-hbm"]["fits"] is False
    assert rows[1]["all-hbm"]["fits"] and rows[1]["ilp"]["hbm_share"] == pytest.approx(1.0)
    assert rows[1]["all-host"]["batch_ms"] > rows[1]["ilp"]["batch_ms"]
    # the fixed costs are the same for both (one pass each): only the row traffic differs
    out = api.plan_embeddings(w, [w.table_bytes + w.dense_bytes], profile_batches=2,
                              held_batches=1, launch_s=0.0, chain_s=0.0)
    bare = {r["name"]: r for r in out["budgets"][0]["rows"]}
    assert rows[1]["all-host"]["batch_ms"] - rows[1]["ilp"]["batch_ms"] == pytest.approx(
        bare["all-host"]["batch_ms"] - bare["ilp"]["batch_ms"])
    assert rows[1]["ilp"]["batch_ms"] - bare["ilp"]["batch_ms"] == pytest.approx(
        1e3 * (COSTS.launch_s + COSTS.pass_floor(w)))


def test_the_dlrm_workload_is_tens_of_gigabytes_of_shapes():
    w = api.embedding_workload("dlrm")
    assert len(w.tables) == 26 and 30e9 < w.table_bytes < 40e9
    assert 0 < w.dense_bytes < 100 << 20
    assert sum(w.blocks_of(i) for i in range(26)) > 16000


# ---- the executor ---------------------------------------------------------------------------
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_placed_lookups_equal_embedding_bag_for_any_placement(mode, padded):
    torch = pytest.importorskip("torch")
    from autotm_py.runtime.embedding_bag import PlacedTables

    gen = torch.Generator().manual_seed(0)
    rows, block_rows = [1000, 70, 129], 64
    weights = [torch.randn(r, 8, generator=gen) for r in rows]
    rng = np.random.default_rng(0)
    nb = [-(-r // block_rows) for r in rows]
    placements = [[np.full(n, code, dtype=np.int8) for n in nb] for code in (HOST, HBM, COPY)]
    placements += [[rng.integers(0, 3, n).astype(np.int8) for n in nb] for _ in range(4)]
    for where in placements:
        tables = PlacedTables.from_weights(weights, where, block_rows)
        idx = [torch.as_tensor(rng.integers(0, r, 300)) for r in rows]
        offsets = [torch.tensor([0, 5, 5, 100, 299])] * 3  # an empty bag too
        got = tables.lookup(idx, offsets, mode=mode, staged=tables.prefetch(idx), padded=padded)
        for g, w, ix, off in zip(got, weights, idx, offsets, strict=True):
            ref = torch.nn.EmbeddingBag.from_pretrained(w, mode=mode)(ix, off)
            torch.testing.assert_close(g, ref)


def _many_tables(torch, placements=3):
    """26 tables of uneven sizes (a short last block in most), placed at random, and a batch."""
    from autotm_py.runtime.embedding_bag import PlacedTables

    gen = torch.Generator().manual_seed(1)
    rng = np.random.default_rng(1)
    rows, block_rows = [int(r) for r in rng.integers(3, 400, 26)], 32
    weights = [torch.randn(r, 4, generator=gen) for r in rows]
    nb = [-(-r // block_rows) for r in rows]
    idx = [torch.as_tensor(rng.integers(0, r, 50)) for r in rows]
    offsets = [torch.arange(0, 50, 2)] * 26
    for _ in range(placements):
        where = [rng.integers(0, 3, n).astype(np.int8) for n in nb]
        yield PlacedTables.from_weights(weights, where, block_rows), weights, idx, offsets


def test_lookups_of_many_tables_equal_embedding_bag():
    torch = pytest.importorskip("torch")
    for tables, weights, idx, offsets in _many_tables(torch):
        got = tables.lookup(idx, offsets, staged=tables.prefetch(idx))
        for g, w, ix, off in zip(got, weights, idx, offsets, strict=True):
            ref = torch.nn.functional.embedding_bag(ix, w, off, mode="sum")
            torch.testing.assert_close(g, ref)


def test_a_lookup_does_no_host_work_that_waits_for_the_device(monkeypatch):
    """Once the batch's layout is made, `lookup` calls nothing that copies device data to the
    host or waits for it (.item/.tolist/.cpu/.numpy, a tensor's truth or int value, ops whose
    output size depends on values): every such call raises here. On the GPU, the benchmark
    checks the same with torch.cuda.set_sync_debug_mode("error")."""
    torch = pytest.importorskip("torch")

    def forbidden(*_args, **_kwargs):
        raise AssertionError("host synchronization in the lookup")

    for tables, weights, idx, offsets in _many_tables(torch, placements=2):
        staged = tables.prefetch(idx)
        tables.lookup(idx, offsets, staged=staged)  # the layout, made once
        with monkeypatch.context() as m:
            for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__index__",
                         "__float__", "nonzero", "unique"):
                m.setattr(torch.Tensor, name, forbidden)
            for name in ("bincount", "unique", "nonzero", "masked_select", "argsort",
                         "repeat_interleave"):
                m.setattr(torch, name, forbidden)
            m.setattr(np, "asarray", forbidden)
            m.setattr(np, "cumsum", forbidden)
            got = tables.lookup(idx, offsets, mode="mean", staged=staged)
        for g, w, ix, off in zip(got, weights, idx, offsets, strict=True):
            torch.testing.assert_close(g, torch.nn.functional.embedding_bag(ix, w, off,
                                                                            mode="mean"))


def test_hbm_and_host_rows_are_pooled_in_one_pass_that_reads_only_their_rows(monkeypatch):
    """The unified lookup: one embedding_bag over a view of both tiers, no padding_idx, every
    index at its own row. The padded lookup (the first executor's) pools each tier apart, the
    host tier's kernel given every HBM-served index at its pad: torch's CUDA kernel loads the
    pad row before zeroing it, so that kernel read the link once per lookup served from HBM,
    more the more blocks are resident (what the H200 run of 2026-12-02 14:03 UTC showed)."""
    torch = pytest.importorskip("torch")
    from autotm_py.runtime import embedding_bag as eb

    gen = torch.Generator().manual_seed(2)
    rows, block_rows = [300, 200], 16
    weights = [torch.randn(r, 8, generator=gen) for r in rows]
    rng = np.random.default_rng(2)
    where = [(rng.random(-(-r // block_rows)) < 0.75).astype(np.int8) for r in rows]  # 1: HBM
    tables = eb.PlacedTables.from_weights(weights, where, block_rows)
    idx = [torch.as_tensor(rng.integers(0, r, 400)) for r in rows]
    offsets = [torch.arange(0, 400, 4)] * 2
    hbm_served = sum(int((w[ix.numpy() // block_rows] == HBM).sum())
                     for w, ix in zip(where, idx, strict=True))
    calls = []
    real = eb.F.embedding_bag

    def spy(inp, weight, offs, *args, **kwargs):
        calls.append((inp.clone(), weight, kwargs.get("padding_idx")))
        return real(inp, weight, offs, *args, **kwargs)

    monkeypatch.setattr(eb.F, "embedding_bag", spy)
    for padded in (False, True):
        calls.clear()
        got = tables.lookup(idx, offsets, padded=padded)
        for g, w, ix, off in zip(got, weights, idx, offsets, strict=True):
            torch.testing.assert_close(g, real(ix, w, off, mode="sum"))
        if not padded:
            (inp, weight, pad), = calls
            assert weight is tables.unified and pad is None
            torch.testing.assert_close(weight[inp], torch.cat([w[ix] for w, ix in
                                                               zip(weights, idx, strict=True)]))
        else:
            assert [c[2] for c in calls] == [tables.fast_rows, tables.host_pad]
            host_inp = calls[1][0]
            assert int((host_inp == tables.host_pad).sum()) == hbm_served  # pads read, on CUDA


def test_the_hbm_tier_is_allocated_a_whole_number_of_rows_from_the_host_tier():
    """What lets one view span both tiers (on CUDA: an alias over unified addresses)."""
    torch = pytest.importorskip("torch")
    from autotm_py.runtime.embedding_bag import rows_aligned_with

    for dim in (3, 16, 100, 128):
        for skew in range(0, 5):
            like = torch.empty(50 * dim + skew)[skew:].view(50, dim)
            fast = rows_aligned_with(like, 7, dim, torch.device("cpu"))
            assert fast.shape == (7, dim) and fast.is_contiguous()
            assert (fast.data_ptr() - like.data_ptr()) % (dim * 4) == 0


def test_copy_ahead_blocks_must_be_prefetched():
    torch = pytest.importorskip("torch")
    from autotm_py.runtime.embedding_bag import PlacedTables

    tables = PlacedTables.from_weights([torch.randn(100, 4)], [np.full(2, COPY, np.int8)], 64)
    with pytest.raises(ValueError, match="prefetch"):
        tables.lookup([torch.tensor([1, 2])], [torch.tensor([0])])


# ---- the command ----------------------------------------------------------------------------
def test_the_command_prints_each_budget_against_the_baselines(tmp_path):
    _register_commands()
    spec = {"name": "tiny", "batch": 64, "dense_bytes": 1024,
            "tables": [{"name": "a", "rows": 2000, "dim": 16}, {"rows": 300, "dim": 16}]}
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(spec))
    args = ["embeddings", str(path), "--budget", "5%,50%,1MiB", "--block-rows", "32",
            "--profile-batches", "4", "--held-batches", "2"]
    text = CliRunner().invoke(cli, args)
    assert text.exit_code == 0, text.output
    assert "tiny: 2 tables" in text.output and "zipf 1.05 seed 0" in text.output
    assert "ILP vs LRU" in text.output and "50.0%" in text.output
    out = CliRunner().invoke(cli, [*args, "--json", "--ranked", "--no-lru"])
    data = json.loads(out.output)
    assert [round(b["share"], 2) for b in data["budgets"]][:2] == [0.05, 0.5]
    assert {r["name"] for r in data["budgets"][1]["rows"]} == {"ilp", "greedy", "all-host",
                                                              "all-hbm"}
    bad = CliRunner().invoke(cli, ["embeddings", str(path), "--budget", "x%"])
    assert bad.exit_code != 0


def test_the_gpu_benchmark_runs_small_on_the_cpu(tmp_path):
    """experiments/gpu/dlrm_embeddings.py --small: every configuration measured, the placed and
    LRU lookups checked against embedding_bag first, the skew written with the results."""
    pytest.importorskip("torch")
    done = subprocess.run(
        [sys.executable, "experiments/gpu/dlrm_embeddings.py", str(tmp_path), "--small",
         "--shares", "0.5", "--iterations", "2", "--warmup", "1", "--profile-batches", "2",
         "--held-batches", "1", "--time-limit", "5"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "dlrm_embeddings.json").read_text())
    assert report["self_check"] is True and report["skew"].startswith("zipf 1.05 seed 0")
    assert [r["name"] for r in report["rows"]] == ["all-host", "ilp", "lru", "all-hbm"]
    assert all(r["throughput_samples_s"] > 0 for r in report["rows"])
