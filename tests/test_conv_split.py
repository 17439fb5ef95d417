"""Splitting fused convolution backward kernels (`ir.conv_split`, `--split-conv-grads`).

A ConvGrad kernel (dY, X, W -> dX, dW[, dB]) holds three image-sized tensors at once; on a
chain of convolutions over a largish image it sets the smallest feasible budget. Split into
ConvGradFilter (+ ConvGradBias) then ConvGradData it holds two, and a budget between the two
minimums is infeasible unsplit and feasible split.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from autotm_py import api, pipeline, workload
from autotm_py.cli import main
from autotm_py.config import PlanConfig
from autotm_py.errors import ConfigError, GraphError
from autotm_py.ir.conv_split import (
    CHUNKS_ATTR,
    CONV_GRAD_PARTS,
    PROFILED_CONV_CHUNKS,
    describe_split,
    fused_conv_grads,
    part_origins,
    split_conv_grads,
    split_names,
    split_variants,
)
from autotm_py.ir.layout import to_channels_last
from autotm_py.options import ModelOptions, RunMode
from autotm_py.plan import Plan
from autotm_py.planning.feasibility import smallest_budget
from autotm_py.runtime.execute import run_steps
from autotm_py.runtime.reference import train_steps
from autotm_py.units import format_bytes
from tests.graphs import costs_for

TRAINING = ModelOptions(training=True)


def conv_onnx(path, n: int = 2, channels: int = 8, size: int = 64) -> str:
    """Three 3x3 convolutions with bias over an n x 3 x size x size image, global pool and a
    classifier: two ConvGrad kernels (the first convolution's input needs no gradient)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(3):
        cin = 3 if i == 0 else channels
        w = rng.standard_normal((channels, cin, 3, 3)).astype(np.float32) * 0.2
        inits += [numpy_helper.from_array(w, f"w{i}"),
                  numpy_helper.from_array(np.full(channels, 0.1, np.float32), f"b{i}")]
        nodes.append(helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"],
                                      pads=[1, 1, 1, 1], name=f"conv{i}"))
        prev = f"c{i}"
    nodes += [helper.make_node("GlobalAveragePool", [prev], ["g"]),
              helper.make_node("Flatten", ["g"], ["f"]),
              helper.make_node("Gemm", ["f", "wf"], ["y"], transB=1)]
    inits.append(numpy_helper.from_array(
        rng.standard_normal((10, channels)).astype(np.float32), "wf"))
    graph = helper.make_graph(
        nodes, "convnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, 10])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              str(path))
    return str(path)


@pytest.fixture(scope="module")
def onnx_path(tmp_path_factory):
    return conv_onnx(tmp_path_factory.mktemp("conv") / "convnet.onnx")


@pytest.fixture(scope="module")
def graph(onnx_path):
    return api.load_model(onnx_path, TRAINING)


@pytest.fixture
def own_costs(monkeypatch):
    """The planner prices a split graph's parts from the profiles: here from the tests' own
    costs (`tests.graphs.costs_for`) as `_between` does, not from the shipped GPU profiles
    (whose entries for these shapes change as profiles are measured)."""
    for module in (pipeline, workload):
        monkeypatch.setattr(module, "load_costs", lambda graph, **kw: costs_for(graph))


def _config(budget: int | None = None, split: str = "off", **kw) -> PlanConfig:
    return PlanConfig(fast_mem_bytes=budget, strategy="sync", recompute="off", run=RunMode(),
                      split_conv_grads=split, **kw)


def _smallest(graph, costs) -> int:
    return smallest_budget(pipeline.machine_for(graph, _config(1 << 40), costs),
                           "sync").budget_bytes


def _between(graph) -> tuple[int, int, int]:
    """The unsplit and split smallest feasible budgets and one between them."""
    before = _smallest(graph, costs_for(graph))
    split = split_conv_grads(graph)
    after = _smallest(split, costs_for(graph).spliced(
        part_origins(graph, split), costs_for(split)))
    assert after < before
    return before, after, (before + after) // 2


def test_the_split_replaces_each_convgrad_by_filter_bias_then_data(graph):
    fused = fused_conv_grads(graph)
    assert [graph.kernels[k].op_type for k in fused] == ["ConvGrad", "ConvGrad"]
    split = split_conv_grads(graph)
    assert not fused_conv_grads(split) and len(split.kernels) == len(graph.kernels) + 4
    assert [(t.name, t.shape, t.role) for t in split.tensors] == \
        [(t.name, t.shape, t.role) for t in graph.tensors]
    for k in fused:
        old = graph.kernels[k]
        stem = old.name.removesuffix("/grad")
        ops = [(split.kernels[j].op_type, split.kernels[j].inputs, split.kernels[j].outputs)
               for j in range(len(split.kernels)) if split.kernels[j].name.startswith(stem + "/")]
        dy, x, w = old.inputs
        dx, dw, db = old.outputs
        assert ops == [("ConvGradFilter", (dy, x), (dw,)), ("ConvGradBias", (dy,), (db,)),
                       ("ConvGradData", (dy, w), (dx,))]
    assert split_names(split) == tuple(sorted(graph.kernels[k].name for k in fused))
    assert ModelOptions.of_graph(split).split_conv_grads == split_names(split)
    origins = part_origins(graph, split)
    assert [o for o, part in origins if part] == [fused[0]] * 3 + [fused[1]] * 3
    assert split.model_hash != graph.model_hash
    # the parts are the kernels the training rules emit where one gradient is needed: the
    # same attributes as conv0's filter part, which the rules derived
    filters = {k.name: k.attrs_dict for k in split.kernels if k.op_type == "ConvGradFilter"}
    assert filters["conv1/grad_filter"].keys() == filters["conv0/grad_filter"].keys()
    assert filters["conv1/grad_filter"]["shape"] == graph.by_name("w1").shape


def test_the_split_graphs_costs_keep_the_measured_ones(graph):
    split = split_conv_grads(graph)
    origins = part_origins(graph, split)
    fused = fused_conv_grads(graph)
    measured = replace(costs_for(graph), workspace_bytes=tuple(
        (1 << 20) * (k.id in fused) for k in graph.kernels))
    fresh = costs_for(split)  # all measured: the parts' own entries win
    assert measured.spliced(origins, fresh).times_s == tuple(
        fresh.times_s[k] if part else measured.times_s[o] for k, (o, part) in enumerate(origins))
    # parts only estimated: they share the measured fused kernel's time, take its workspace
    estimated = replace(fresh, estimated=tuple(part for _, part in origins))
    costs = measured.spliced(origins, estimated)
    for f in fused:
        parts = [k for k, (o, part) in enumerate(origins) if part and o == f]
        assert sum(costs.times_s[k] for k in parts) == pytest.approx(measured.times_s[f])
        assert all(costs.workspace_bytes[k] == 1 << 20 for k in parts)
    kept = [k for k, (_, part) in enumerate(origins) if not part]
    assert [costs.workspace_bytes[k] for k in kept] == [0] * len(kept)


def test_splitting_by_name_and_unknown_names(graph):
    name = graph.kernels[fused_conv_grads(graph)[0]].name
    one = split_conv_grads(graph, [name])
    assert split_names(one) == (name,) and len(fused_conv_grads(one)) == 1
    both = split_conv_grads(one, [graph.kernels[fused_conv_grads(graph)[1]].name])
    assert both.model_hash == split_conv_grads(graph).model_hash
    assert split_conv_grads(graph, []) is graph
    with pytest.raises(GraphError, match="no fused convolution backward kernel"):
        split_conv_grads(graph, ["conv0/grad_filter"])


def test_the_split_keeps_the_channels_last_layout(graph):
    assert split_conv_grads(to_channels_last(graph)).model_hash == \
        to_channels_last(split_conv_grads(graph)).model_hash


def test_the_split_lowers_the_smallest_feasible_budget(graph):
    before, after, _ = _between(graph)
    # three image-sized tensors (dY, X, dX) at once, then two
    image = graph.tensors[graph.kernels[fused_conv_grads(graph)[0]].inputs[0]].nbytes
    assert before - after >= image * 0.9


def test_auto_makes_a_budget_between_the_minimums_feasible(graph, own_costs):
    before, after, budget = _between(graph)
    costs = costs_for(graph)
    off = api.optimize(graph, _config(budget), costs=costs)
    assert off.status == "infeasible" and off.min_feasible_budget_bytes == before
    assert "ConvGrad" in off.message
    result = api.optimize(graph, _config(budget, "auto"), costs=costs)
    assert result.plan is not None and result.graph is not None
    assert split_names(result.graph) == ("conv1/grad", "conv2/grad")
    note = ("split 2 convolution backward kernels into their filter and data parts so that the "
            f"budget fits: smallest feasible budget {format_bytes(before)} -> "
            f"{format_bytes(after)}")
    assert any(n.startswith(note) for n in result.plan.header.notes), result.plan.header.notes
    plan = result.plan.validate(result.graph)
    assert plan.header.budget_bytes == budget
    assert plan.header.model.split_conv_grads == ("conv1/grad", "conv2/grad")
    assert plan.header.config["split_conv_grads"] == "auto"
    assert result.fast_peak_bytes <= budget
    # the split graph simulates strictly (priced as it was planned)
    assert pipeline.simulate(result.graph, plan).fast_peak_bytes <= budget
    assert result.to_dict()["split_conv_grads"] == ["conv1/grad", "conv2/grad"]
    # a feasible budget is planned as it is
    roomy = api.optimize(graph, _config(before, "auto"), costs=costs)
    assert roomy.plan is not None and roomy.graph is None
    assert not any("split" in n for n in roomy.plan.header.notes)


def test_auto_leaves_a_budget_the_split_cannot_fit_infeasible(graph, own_costs):
    _, after, _ = _between(graph)
    result = api.optimize(graph, _config(after - 1024, "auto"), costs=costs_for(graph))
    assert result.status == "infeasible" and result.graph is None
    assert "splitting 2 convolution backward kernels into their filter and data parts would " \
        "lower it to" in result.message


def test_on_splits_every_one_and_bad_modes_are_refused(graph, own_costs):
    before, _, _ = _between(graph)
    result = api.optimize(graph, _config(before, "on"), costs=costs_for(graph))
    assert result.plan is not None and len(split_names(result.graph)) == 2
    assert any("(--split-conv-grads on)" in n for n in result.plan.header.notes)
    with pytest.raises(ConfigError, match="--split-conv-grads"):
        PlanConfig(split_conv_grads="yes")


def test_the_split_plan_trains_as_the_unsplit_graph_does(graph, own_costs):
    _, _, budget = _between(graph)
    result = api.optimize(graph, _config(budget, "auto"), costs=costs_for(graph))
    assert any(True for _ in result.plan.moves())  # a plan that moves data, not all-fast
    unsplit = run_steps(graph, pipeline.all_fast_plan(graph), steps=2, seed=4)
    split = run_steps(result.graph, result.plan, steps=2, seed=4)
    assert len(split) == 2
    for a, b in zip(unsplit, split, strict=True):
        assert a.keys() == b.keys()
        for tid in a:
            torch.testing.assert_close(a[tid], b[tid], rtol=1e-5, atol=1e-5)


def test_load_graph_rebuilds_the_split_a_plan_records(onnx_path, graph):
    split = split_conv_grads(graph)
    rebuilt = api.load_model(onnx_path, ModelOptions(training=True,
                                                     split_conv_grads=split_names(split)))
    assert rebuilt.model_hash == split.model_hash


def _cli(onnx_path, budget, *extra):
    return main(["optimize", onnx_path, "--training", "--fast-mem", str(budget), "--strategy",
                 "sync", "--recompute", "off", "--no-arena", "--no-replay",
                 "--no-channels-last", "--no-baselines", "--precision", "fp32", *extra])


def test_the_cli_splits_by_default_and_run_rebuilds_the_split(onnx_path, graph, tmp_path,
                                                              capsys):
    costs = api.load_costs(graph, device="cuda")
    split = split_conv_grads(graph)
    fresh = api.load_costs(split, device="cuda")
    before = _smallest(graph, costs)
    after = _smallest(split, costs.spliced(part_origins(graph, split), fresh))
    budget = (before + after) // 2
    assert _cli(onnx_path, budget, "--split-conv-grads", "off") == 3
    assert "infeasible" in capsys.readouterr().out
    out = tmp_path / "plan.json"
    assert _cli(onnx_path, budget, "-o", str(out)) == 0
    text = capsys.readouterr().out
    assert "split 2 convolution backward kernels into their filter and data parts so that the " \
        "budget fits" in text
    plan = Plan.load(out)
    assert plan.header.model.split_conv_grads == ("conv1/grad", "conv2/grad")
    assert json.loads(out.read_text())["header"]["model"]["split_conv_grads"] == \
        ["conv1/grad", "conv2/grad"]
    # simulate (and run) rebuild the split graph from the plan's header
    assert main(["simulate", "--plan", str(out)]) == 0
    capsys.readouterr()
    assert main(["optimize", "--help-all"]) == 0
    assert "--split-conv-grads" in capsys.readouterr().out


def test_bench_splits_every_model_and_its_child_rebuilds_the_split(onnx_path, tmp_path,
                                                                  monkeypatch):
    """`bench --split-conv-grads`: the rows are named +split, every plan is for the split
    graph, and the process that runs an arena plan is told which kernels to split, so the
    graph it builds is the one the plan was made for."""
    from types import SimpleNamespace

    from autotm_py.bench import BenchSpec, child, run_bench

    requests, in_process = [], []

    def fake_execute(graph, plan, **kw):
        in_process.append(graph)
        return SimpleNamespace(median_s=0.5, peak_fast_bytes=1000, host_median_s=0.1,
                               alloc_retries=0, device_busy_s=None)

    def fake_isolated(request, plan):
        requests.append((request, plan))
        return SimpleNamespace(median_s=0.25, peak_fast_bytes=900, host_median_s=0.01,
                               alloc_retries=0, reserved_peak_bytes=950)

    monkeypatch.setattr(api, "execute", fake_execute)
    monkeypatch.setattr(child, "run_isolated", fake_isolated)
    spec = BenchSpec(models=(onnx_path,), ratios=("1:0",), strategies=("sync",),
                     device="cuda", recompute="off", model=TRAINING, execute=True,
                     run=RunMode(arena=True), split_conv_grads=True,
                     plans_dir=str(tmp_path / "plans"))
    row = run_bench(spec, tmp_path / "b.csv", workers=1).rows[0]
    assert row["options"].endswith("+split") and row["status"] == "optimal", row.get("notes")
    (request, plan), = requests
    rebuilt = api.load_model(request.model, ModelOptions(**request.options))
    assert rebuilt.model_hash == plan.header.model_hash
    assert fused_conv_grads(rebuilt) == [] and split_names(rebuilt) == ("conv1/grad",
                                                                       "conv2/grad")
    assert in_process and all(not fused_conv_grads(g) for g in in_process)


def test_profile_measures_the_split_parts_too(onnx_path, tmp_path, capsys):
    """`profile --split-conv-grads`: the parts of the split graph are in the cache, so a
    split plan's parts are priced by measurement, not estimated."""
    cache = tmp_path / "profiles"
    split = split_conv_grads(api.load_model(onnx_path, replace(TRAINING, batch=1)))
    before = api.load_costs(split, device="cpu", profiles_dir=cache)
    assert any(before.estimated)
    assert main(["profile", onnx_path, "--training", "--batch", "1", "--device", "cpu",
                 "--profiles", str(cache), "--repeats", "1", "--warmup", "0",
                 "--split-conv-grads", "--no-progress"]) == 0
    capsys.readouterr()
    after = api.load_costs(split, device="cpu", profiles_dir=cache)
    assert not any(after.estimated)


# ---- convolutions in batch chunks: where their measured workspace sets the floor ----------
CHUNKED = ("conv0#2", "conv1#2", "conv2#2", "conv1/grad#2", "conv2/grad#2")
WORKSPACE = 4 << 20  # cuDNN-like: several times the largest tensor of the graph


def test_chunked_convolutions_and_parts_train_as_the_whole_batch(graph):
    """Forward convolutions and a fused backward kernel's parts over slices of the batch: the
    outputs are the whole batch's (the filter gradients summed, within float rounding)."""
    split = split_conv_grads(graph, CHUNKED)
    assert split_names(split) == tuple(sorted(CHUNKED))
    chunks = {k.name: k.attr(CHUNKS_ATTR) for k in split.kernels if k.attr(CHUNKS_ATTR)}
    assert chunks == {"conv0": 2, "conv1": 2, "conv2": 2, "conv1/grad_filter": 2,
                      "conv1/grad_data": 2, "conv2/grad_filter": 2, "conv2/grad_data": 2}
    assert describe_split(graph, CHUNKED) == (
        "2 convolution backward kernels into their filter and data parts (2 in chunks of the "
        "batch) and 3 convolutions into chunks of the batch")
    whole = train_steps(graph, 2, seed=4)
    for a, b in zip(train_steps(split, 2, seed=4), whole, strict=True):
        for tid in graph.outputs:
            torch.testing.assert_close(a[tid], b[tid], rtol=1e-5, atol=1e-6)
    with pytest.raises(GraphError, match="count of chunks"):
        split_conv_grads(graph, ["conv1"])  # a forward convolution only in chunks


def _measured_workspace(graph):
    """The tests' costs with `WORKSPACE` measured for each whole convolution and fused
    backward kernel, and a split's parts and chunked kernels unmeasured (priced from them)."""
    costs = costs_for(graph)
    whole = [k.op_type in ("Conv", "ConvGrad") and not k.attr(CHUNKS_ATTR)
             for k in graph.kernels]
    return replace(costs, workspace_bytes=tuple(WORKSPACE if w else 0 for w in whole),
                   estimated=tuple(k.op_type in CONV_GRAD_PARTS.get("ConvGrad", ()) or
                                   bool(k.attr(CHUNKS_ATTR)) for k in graph.kernels))


def test_auto_chunks_convolutions_whose_workspace_the_budget_cannot_hold(graph, monkeypatch,
                                                                         tmp_path):
    """Where a fused backward kernel's parts and the forward convolutions still need more than
    the budget with their whole workspace, `auto` runs them in batch chunks (each a share of
    the workspace), the plan fits, trains as the unsplit graph and rebuilds from its file."""
    for module in (pipeline, workload):
        monkeypatch.setattr(module, "load_costs", lambda g, **kw: _measured_workspace(g))

    def floor(names) -> int:
        work = workload.split_workload(workload.Workload(graph, _measured_workspace(graph)),
                                       names)
        return _smallest(work.graph, work.costs)

    plain, chunked = floor(None), floor(CHUNKED)
    assert chunked < plain < _smallest(graph, _measured_workspace(graph))
    budget = (plain + chunked) // 2
    result = api.optimize(graph, _config(budget, "auto"), costs=_measured_workspace(graph))
    assert result.plan is not None and result.graph is not None, result.message
    assert any(n.startswith("split 2 convolution backward kernels into their filter and data "
                            "parts (2 in chunks of the batch) and 3 convolutions into chunks")
               for n in result.plan.header.notes), result.plan.header.notes
    assert result.fast_peak_bytes <= budget
    for a, b in zip(run_steps(result.graph, result.plan, steps=2, seed=4),
                    train_steps(graph, 2, seed=4), strict=True):
        for tid in graph.outputs:
            torch.testing.assert_close(a[tid], b[tid], rtol=1e-5, atol=1e-6)
    path = tmp_path / "plan.json"
    result.plan.save(path)
    rebuilt = workload.planned_graph(graph, Plan.load(path))
    assert rebuilt.model_hash == result.graph.model_hash


def test_profile_variants_chunk_the_convolutions_up_to_their_cap(tmp_path):
    """`profile --split-conv-grads` measures each power-of-two count of chunks of every
    convolution up to `PROFILED_CONV_CHUNKS` (of a batch of 16 images: 2, 4 and 8)."""
    g = api.load_model(conv_onnx(tmp_path / "b16.onnx", n=16, size=8), TRAINING)
    counts = sorted({int(k.attr(CHUNKS_ATTR)) for v in split_variants(g) for k in v.kernels
                     if k.op_type == "Conv" and k.attr(CHUNKS_ATTR)})
    assert counts == [c for c in (2, 4, 8, 16) if c <= PROFILED_CONV_CHUNKS]


def test_chunks_are_doubled_where_the_measured_chunks_need_more(tmp_path, monkeypatch):
    """`auto` fits each convolution's chunks to a share of its whole workspace; where the
    profiles measured the chunked kernels and 2 chunks keep 90% of it (cuDNN chooses its
    algorithm per batch), the forcing kernel's chunks are doubled until the split fits."""
    g = api.load_model(conv_onnx(tmp_path / "b4.onnx", n=4), TRAINING)

    def measured_chunks(split):
        costs = _measured_workspace(split)
        ws, est = list(costs.workspace_bytes), list(costs.estimated)
        for k in split.kernels:
            chunks = int(k.attr(CHUNKS_ATTR) or 1)
            if chunks > 1:
                ws[k.id] = WORKSPACE * 9 // 10 if chunks == 2 else WORKSPACE // chunks
                est[k.id] = False
        return replace(costs, workspace_bytes=tuple(ws), estimated=tuple(est))

    pricing = [_measured_workspace]  # what the profiles hold: set per step below
    for module in (pipeline, workload):
        monkeypatch.setattr(module, "load_costs", lambda graph, **kw: pricing[0](graph))

    def floor(names, priced) -> int:
        pricing[0] = priced
        work = workload.split_workload(workload.Workload(g, priced(g)), names)
        return _smallest(work.graph, work.costs)

    quarters = [n.replace("#2", "#4") for n in CHUNKED]
    budget = floor(CHUNKED, _measured_workspace)  # what 2 chunks need at half the workspace
    assert floor(quarters, measured_chunks) <= budget < floor(CHUNKED, measured_chunks)
    pricing[0] = measured_chunks
    result = api.optimize(g, _config(budget, "auto"), costs=measured_chunks(g))
    assert result.plan is not None, result.message
    assert max(int(k.attr(CHUNKS_ATTR) or 1) for k in result.graph.kernels) == 4
    assert result.fast_peak_bytes <= budget
