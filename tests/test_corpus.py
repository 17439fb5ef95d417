"""The exported corpus (models/corpus/, issue 45 items 4 and 8): torch modules that are not in
the zoo, exported by torch's TorchScript exporter, each imported from its committed file,
planned at two budgets, verified, and trained on the CPU.

For every model: the committed file is what `make_corpus.py` declares (its inputs, their
shapes, the structure a fresh export has); its forward graph on the file's weights computes
what the torch module computes; its training graph (through `api.load_model`, as `autotm
inspect --training` builds it) plans at half and at a quarter of its peak, raised to the
smallest feasible budget where that is higher (the tiny models' convolution and LSTM
gradients need a large share of their small peaks), and every plan passes the strict
simulation (the verifier); and 3 SGD steps of the executor running the half-peak plan equal
the reference runner bitwise, whose losses, gradients and updated weights equal
torch.autograd's of the same graph, and whose losses equal the torch module's (1e-5).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F

from autotm_py import api
from autotm_py.config import PlanConfig
from autotm_py.frontend.weights import initializer_values
from autotm_py.ir import TensorGraph
from autotm_py.options import RunMode
from autotm_py.pipeline import machine_for
from autotm_py.planning.feasibility import min_feasible_budget
from autotm_py.profiling.profile import load_costs
from autotm_py.runtime.execute import run_steps
from autotm_py.runtime.reference import autograd_steps, init_values, run_graph, train_steps
from autotm_py.units import parse_ratio

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "models" / "corpus"
STEPS = 3
TIME_LIMIT_S = 3.0
# the file trains the convolutions with the BatchNorm folded into them, not the module's BN
NO_MODULE_TRAINING = {"resnext_small": "BatchNorm folded into the convolutions at export"}


def _script():
    spec = importlib.util.spec_from_file_location("make_corpus", CORPUS / "make_corpus.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_corpus", module)
    spec.loader.exec_module(module)
    return module


CORPUS_SCRIPT = _script()
SPECS = {s.name: s for s in CORPUS_SCRIPT.SPECS}
_CACHE: dict[tuple, object] = {}


def _once(key: tuple, make):
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


def _path(name: str) -> Path:
    return CORPUS / f"{name}.onnx"


def _training(name: str) -> TensorGraph:
    """The training graph `autotm inspect FILE --training` builds."""
    return _once(("train", name), lambda: api.load_model(_path(name), training=True))


def _budgets(graph: TensorGraph, costs) -> dict[str, int]:
    """Half and a quarter of the all-fast peak (workspace included, as `--ratio` takes it),
    each at least the smallest budget at which a plan exists; where that leaves them equal,
    the higher one is halfway between that smallest budget and the peak."""
    machine = machine_for(graph, _config(ratio=parse_ratio("1:0")), costs)  # no budget
    peak, _ = machine.peak
    need, _ = min_feasible_budget(machine, "sync")
    half, quarter = max(peak // 2, need), max(peak // 4, need)
    if half == quarter:
        half = (need + peak) // 2
    return {"half": half, "quarter": quarter}


def _config(**kwargs) -> PlanConfig:
    """The portable plan: sync, eager on torch's allocator (the GPU defaults' arena keeps a
    scratch region that can exceed these small models' whole peak)."""
    return PlanConfig(strategy="sync", run=RunMode(), **kwargs)


def _plans(name: str) -> dict[str, object]:
    def make():
        graph = _training(name)
        costs = load_costs(graph, device="cuda")
        out = {}
        for label, budget in _budgets(graph, costs).items():
            config = _config(fast_mem_bytes=budget, time_limit_s=TIME_LIMIT_S)
            out[label] = (budget, api.optimize(graph, config, costs=costs), costs)
        return out
    return _once(("plans", name), make)


def _file_values(name: str, graph: TensorGraph) -> dict[int, torch.Tensor]:
    """Seeded values of every leaf of `graph`, the file's weights where it has them, the
    script's example inputs, and seeded labels."""
    values = init_values(graph)
    model = onnx.load(_path(name))
    for tid, value in initializer_values(model, graph).values.items():
        values[tid] = torch.from_numpy(value.copy())
    for input_name, value in CORPUS_SCRIPT.example_inputs(SPECS[name]).items():
        values[graph.by_name(input_name).id] = value
    meta = graph.meta.get("training")
    if meta is not None:  # labels below the class count of the loss's class axis
        loss = graph.kernels[meta["loss_kernel"]]
        classes = graph.tensors[loss.inputs[0]].shape[loss.attr("axis")]
        labels = graph.tensors[meta["labels"]]
        values[labels.id] = torch.randint(0, classes, labels.shape,
                                          generator=torch.Generator().manual_seed(3))
    return values


# ---- the files ---------------------------------------------------------------------------------
def test_the_corpus_has_at_least_nine_models_and_no_stray_files():
    assert len(SPECS) >= 9
    assert {p.stem for p in CORPUS.glob("*.onnx")} == set(SPECS)
    assert not list(CORPUS.glob("*.data"))  # small files hold their weights


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_committed_file_is_what_the_script_declares(name, tmp_path):
    path = _path(name)
    assert path.stat().st_size < 1_000_000
    model = onnx.load(path)
    assert model.graph.name == name and model.opset_import[0].version == CORPUS_SCRIPT.OPSET
    declared = SPECS[name].inputs("small")
    got = {i.name: i.type.tensor_type for i in model.graph.input}
    assert list(got) == list(declared)
    for input_name, (shape, dtype, _) in declared.items():
        dims = got[input_name].shape.dim
        assert dims[0].dim_param == "batch"  # the dynamic batch axis
        assert tuple(d.dim_value for d in dims[1:]) == shape[1:]
        want = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(str(dtype).split(".")[-1]))
        assert got[input_name].elem_type == want
    graph = api.import_onnx(path)
    assert graph.meta["dims"] == {"batch": next(iter(declared.values()))[0][0]}
    # a fresh export has the same structure (nodes, attributes, initializer shapes)
    fresh = CORPUS_SCRIPT.export(SPECS[name], tmp_path / f"{name}.onnx")
    assert api.import_onnx(fresh).meta["onnx_hash"] == graph.meta["onnx_hash"]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_imported_forward_graph_computes_what_the_module_computes(name):
    graph = api.import_onnx(_path(name))
    out = run_graph(graph, _file_values(name, graph))[graph.outputs[0]]
    module = CORPUS_SCRIPT.build_module(SPECS[name])
    with torch.no_grad():
        want = module(*CORPUS_SCRIPT.example_inputs(SPECS[name]).values())
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


# what each file must import as (forward kernels, fused): the forms the corpus is there for
EXERCISES = {
    "mobilenet_dw": {"BatchNormalization", "Clip", "Conv"},
    "unet_small": {"ConvRelu", "ConvTranspose", "Resize", "Concat", "MaxPool"},
    "vit_tiny": {"ScaledDotProductAttention", "Gelu", "LayerNormalization", "Concat",
                 "Gather"},
    "gpt2_tied": {"ScaledDotProductAttention", "Gelu", "Linear", "Gather"},
    "llama_gqa": {"ScaledDotProductAttention", "RMSNormalization", "Silu", "RotaryEmbedding",
                  "Expand", "MatMul"},
    "lstm_classifier": {"LSTM", "Gather", "Gemm"},
    "gated_mlp": {"Gemm", "Silu", "Slice", "LayerNormalization"},
    "convnext_tiny": {"Conv", "LayerNormalization", "Transpose", "Gelu", "Linear"},
    "mlp_mixer": {"Linear", "Gelu", "Transpose", "ReduceMean"},
    "resnext_small": {"ConvRelu", "Conv", "MaxPool", "Gemm"},
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_file_imports_the_forms_it_is_there_for(name):
    graph = api.import_onnx(_path(name))
    ops = {k.op_type for k in graph.kernels}
    assert EXERCISES[name] <= ops, EXERCISES[name] - ops
    if name in ("mobilenet_dw", "resnext_small", "convnext_tiny"):  # depthwise or grouped
        assert any(k.attr("group") > 1 for k in graph.kernels if k.op_type in ("Conv",
                                                                           "ConvRelu"))
    if name == "llama_gqa":  # the float32 casts of a float32 export are no copies
        assert "Cast" not in ops
    if name == "gpt2_tied":  # one table, read by the Gather and the head
        (table,) = [t for t in graph.tensors if t.name == "wte.weight"]
        assert {graph.kernels[k].op_type for k in table.users} == {"Gather", "Linear"}


# ---- planning ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_training_graph_plans_and_verifies_at_two_budgets(name):
    graph = _training(name)
    assert graph.meta["training"]["loss"] is not None
    for label, (budget, result, costs) in _plans(name).items():
        assert result.feasible and result.plan is not None, (label, result.message)
        result.plan.validate(graph)
        sim = api.simulate(graph, result.plan, costs=costs)  # strict: raises at a violation
        assert sim.fast_peak_bytes <= budget, label
        assert sim.total_s == pytest.approx(result.predicted_time_s)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_peak_a_ratio_divides_holds_every_working_set(name):
    """The unconstrained peak (`graph.peak_live_bytes`, what `--ratio` divides) counts the
    running kernel's workspace as its working set does, so no kernel's working set is above
    its live bytes (the LSTM classifier's LSTMGrad, whose recomputation workspace is most of
    it, was 1.4x the peak: every ratio was below it)."""
    graph = _training(name)
    assert np.all(graph.working_set_bytes <= graph.live_bytes)
    assert graph.peak_live_bytes >= graph.max_working_set[0]


def test_an_lstm_ratio_budget_plans_or_names_the_kernel_it_is_below():
    """Without the reserve, 4:1 of the LSTM classifier's peak holds its largest working set
    (LSTMGrad's inputs, outputs and workspace) and plans; 1:1 is below that kernel alone, and
    the result names it and the smallest budget above the ratio's."""
    graph = _training("lstm_classifier")
    costs = load_costs(graph, device="cuda")
    ws, ws_kernel = graph.max_working_set
    assert graph.kernels[ws_kernel].op_type == "LSTMGrad"
    results = {ratio: api.optimize(graph, _config(ratio=parse_ratio(ratio), reserve_bytes=0,
                                                  time_limit_s=TIME_LIMIT_S), costs=costs)
               for ratio in ("1:1", "4:1")}
    plans = results["4:1"]
    assert plans.feasible and plans.plan is not None, plans.message
    assert plans.budget_bytes == int(graph.peak_live_bytes * 0.8) >= ws
    half = results["1:1"]
    assert not half.feasible and half.budget_bytes == graph.peak_live_bytes // 2 < ws
    assert half.min_feasible_budget_bytes is not None and half.smallest is not None
    assert half.budget_bytes < half.min_feasible_budget_bytes <= plans.budget_bytes
    assert half.smallest.short(half.budget_bytes) == f"kernel #{ws_kernel} LSTMGrad"


# ---- training ----------------------------------------------------------------------------------
def _module_losses(name: str, graph: TensorGraph, values: dict[int, torch.Tensor]
                   ) -> list[float]:
    """torch.optim.SGD steps of the module itself (train mode: batch statistics) on the
    graph's labels, with the graph's learning rate."""
    module = CORPUS_SCRIPT.build_module(SPECS[name]).train()
    inputs = CORPUS_SCRIPT.example_inputs(SPECS[name])
    labels = values[graph.meta["training"]["labels"]]
    opt = torch.optim.SGD(module.parameters(), lr=graph.meta["training"]["learning_rate"])
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        out = module(*inputs.values())
        if out.dim() == 3:  # (N, T, V): classes on the last axis
            out = out.reshape(-1, out.shape[-1])
        loss = F.cross_entropy(out, labels.reshape(out.shape[:1] + out.shape[2:]))
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_executor_trains_like_torch(name):
    graph = _training(name)
    _, result, _ = _plans(name)["half"]
    values = _file_values(name, graph)
    meta = graph.meta["training"]
    grads = [g for _, g in meta["weight_grads"]]
    executed = run_steps(graph, result.plan, steps=STEPS, masters=values)
    reference = train_steps(graph, STEPS, values=values, keep=grads)
    for step, (got, want) in enumerate(zip(executed, reference, strict=True)):
        for tid in graph.outputs:  # the loss and every updated weight
            assert torch.equal(got[tid], want[tid]), (step, graph.name_of(tid))
    autograd = autograd_steps(graph, STEPS, values=values)
    for step, (ours, theirs) in enumerate(zip(reference, autograd, strict=True)):
        for tid in theirs:  # the loss, the weight gradients, the updated weights
            torch.testing.assert_close(ours[tid], theirs[tid], rtol=1e-5, atol=1e-6,
                                       msg=lambda m, t=tid, s=step:
                                       f"step {s}, {graph.name_of(t)}: {m}")
    losses = [float(out[meta["loss"]]) for out in reference]
    assert len(set(losses)) == STEPS  # the weights moved
    if name not in NO_MODULE_TRAINING:
        np.testing.assert_allclose(losses, _module_losses(name, graph, values), rtol=1e-5)


# ---- the GPU script ----------------------------------------------------------------------------
def test_the_gpu_script_exports_plans_and_summarizes(tmp_path):
    """experiments/gpu/corpus_bench.sh in its CPU mode (SOLVE=1: plans only, no GPU), on the
    small sizes: it exports what its corpus folder lacks, writes the bench's rows and the
    compact summary."""
    import json
    import os
    import subprocess

    out = tmp_path / "out"
    env = os.environ | {"SOLVE": "1", "SCALE": "small", "RATIOS": "1:1", "TIME_LIMIT": "5"}
    done = subprocess.run(["bash", "experiments/gpu/corpus_bench.sh", str(out), "gated_mlp"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (out / "corpus" / "gated_mlp.onnx").exists() and (out / "corpus_bench.csv").exists()
    (row,) = json.loads((out / "corpus_summary.json").read_text())["rows"]
    assert (row["model"], row["ratio"], row["strategy"]) == ("gated_mlp", "1:1",
                                                             "async+recompute")
    # the 68 MiB runtime reserve of the real preset leaves a 0.5 MiB model no room: a row, no plan
    assert row["status"] == "infeasible" and row["budget_bytes"] == row["peak_bytes"] // 2
    assert (out / "corpus_summary.csv").read_text().splitlines()[1].startswith("gated_mlp,")
