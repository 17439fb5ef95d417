"""bf16 mixed precision as torch.autocast runs it (`ir.precision`, docs/precision.md): the
transform's dtypes and casts on a small transformer and a small CNN, the training graph's
dtypes (fp32 master weights, gradients and optimizer state), our bf16 step against
torch.autograd of the same graph, the Trainer's loss curve against PyTorch's autocast training,
lower peaks, and `--precision bf16` through the CLI."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F

from autotm_py.cli import main
from autotm_py.errors import ConfigError, GraphError
from autotm_py.frontend.fuse import fuse_graph
from autotm_py.ir import Role, TensorGraph
from autotm_py.ir.precision import FP32, LOWER, with_precision
from autotm_py.ir.training import derive_training
from autotm_py.options import ModelOptions
from autotm_py.runtime.reference import init_values, run_graph
from tests.test_trainer import (
    MLP,
    MODELS,
    OPTIMIZERS,
    TinyLM,
    batches,
    lm_loss,
    torch_training,
    trainer_training,
)
from tests.test_training_models import small_cnn, tiny_decoder
from tests.test_training_ops import compare_training

BF16, FP32_DTYPE = "bfloat16", "float32"
# Loss of each of 20 Trainer steps in bf16 against PyTorch's own autocast training of the same
# module: relative. bf16 keeps 8 bits of mantissa (~4e-3 relative rounding per op); a few ops
# deep the loss moves by ~1e-3, and torch's CPU autocast keeps softmax and layer norm in bf16
# where we follow the CUDA lists (fp32). Measured: 0 (MLP, CNN), 9.3e-5 (transformer).
LOSS_RTOL = 2e-2
GRAPHS = {"decoder": tiny_decoder, "decoder-fused": lambda: fuse_graph(tiny_decoder()),
          "cnn": small_cnn, "cnn-fused": lambda: fuse_graph(small_cnn())}


def _float_io(g: TensorGraph, tids: tuple[int, ...]) -> list[str]:
    return [g.tensors[t].dtype for t in tids if g.tensors[t].dtype in (BF16, FP32_DTYPE)]


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_each_op_runs_in_the_type_autocast_gives_it(name):
    forward = GRAPHS[name]()
    bf16 = with_precision(forward, "bf16")
    assert bf16.meta["precision"] == "bf16" and with_precision(forward, "fp32") is forward
    ops = {k.op_type for k in bf16.kernels}
    assert ops & LOWER and "Cast" in ops
    for k in bf16.kernels:
        if k.op_type in LOWER:
            assert set(_float_io(bf16, k.io)) == {BF16}, k.name
        elif k.op_type in FP32:
            assert set(_float_io(bf16, k.io)) == {FP32_DTYPE}, k.name
    # forward tensors keep their ids, weights stay fp32 masters; each copy is one Cast's
    # output, an activation (made each iteration, the planner's to keep, move or recompute)
    for old in forward.tensors:
        if old.role == Role.WEIGHT:
            assert bf16.tensors[old.id].dtype == FP32_DTYPE and bf16.tensors[old.id].role == \
                Role.WEIGHT
    copies = [t for t in bf16.tensors if t.name.endswith("::bf16") and t.producer is not None
              and bf16.kernels[t.producer].op_type == "Cast"]
    assert copies and all(t.role == Role.ACTIVATION for t in copies)
    sources = [bf16.kernels[t.producer].inputs[0] for t in copies]
    assert len(sources) == len(set(sources))  # one copy per tensor, shared by its readers
    # the output comes back in fp32 under its name (the loss reads fp32)
    out = bf16.tensors[bf16.outputs[0]]
    assert out.dtype == FP32_DTYPE and out.name == forward.name_of(forward.outputs[0])
    assert bf16.kernels[out.producer].op_type == "Cast"


def test_the_cnn_keeps_bf16_images_and_fp32_batch_norm_parameters():
    bf16 = with_precision(small_cnn(), "bf16")
    for k in bf16.kernels:
        if k.op_type == "BatchNormalization":
            assert [bf16.tensors[t].dtype for t in k.inputs] == [BF16] + [FP32_DTYPE] * 4
        if k.op_type in ("Relu", "MaxPool", "Add", "Concat", "AveragePool", "Dropout"):
            assert set(_float_io(bf16, k.io)) == {BF16}, k.name


def test_mixed_inputs_promote_as_torch_does():
    """A residual Add of an fp32 stream and a bf16 product runs in fp32 (the product cast
    up); attention's 0-d scale constant does not promote the bf16 scores."""
    bf16 = with_precision(tiny_decoder(), "bf16")
    by_op = {}
    for k in bf16.kernels:
        by_op.setdefault(k.op_type, []).append(k)
    scale = next(k for k in by_op["Mul"] if bf16.name_of(k.inputs[1]) == "scale")
    assert bf16.tensors[scale.outputs[0]].dtype == BF16
    assert bf16.tensors[scale.inputs[1]].dtype == FP32_DTYPE  # the constant itself stays
    residual = [k for k in by_op["Add"] if bf16.tensors[k.outputs[0]].dtype == FP32_DTYPE
                and any(bf16.name_of(t).endswith("::fp32") for t in k.inputs)]
    assert residual


def test_training_graph_has_fp32_masters_gradients_and_state_and_bf16_activations():
    train = derive_training(with_precision(fuse_graph(tiny_decoder()), "bf16"), optimizer="adam")
    for w, g in train.meta["training"]["weight_grads"]:
        assert train.tensors[w].dtype == train.tensors[g].dtype == FP32_DTYPE
    assert all(t.dtype == FP32_DTYPE for t in train.tensors_with_role(Role.OPTIMIZER_STATE))
    assert "CastGrad" in {k.op_type for k in train.kernels}
    assert any(t.dtype == BF16 for t in train.tensors_with_role(Role.GRADIENT))
    # every kernel of ours writes what the IR says (bytes and peaks follow from the IR)
    values = run_graph(train, init_values(train), keep=range(len(train.tensors)))
    wrong = [train.name_of(t) for t, v in values.items()
             if v.dtype != getattr(torch, train.tensors[t].dtype)]
    assert not wrong


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_a_bf16_step_equals_torch_autograd_of_the_same_graph(name, optimizer):
    """Our backward kernels against autograd through the bf16 forward kernels (Casts
    included): measured equal to 5e-8 relative, the tolerance is fp32-sized."""
    compare_training(with_precision(GRAPHS[name](), "bf16"), steps=3, optimizer=optimizer,
                     rtol=1e-4)


def test_bf16_lowers_the_training_peak():
    for graph in (small_cnn(n=8), fuse_graph(tiny_decoder(batch=8, seq=32, d=32))):
        fp32 = derive_training(graph, optimizer="adam")
        bf16 = derive_training(with_precision(graph, "bf16"), optimizer="adam")
        assert bf16.peak_live_bytes < 0.8 * fp32.peak_live_bytes, graph.name


def test_bad_precisions_and_training_graphs_are_refused():
    with pytest.raises(ConfigError, match="fp16"):
        ModelOptions(precision="fp16")
    with pytest.raises(GraphError, match="forward"):
        with_precision(derive_training(small_cnn()), "bf16")
    graph = with_precision(small_cnn(), "bf16")
    assert ModelOptions.of_graph(graph).precision == "bf16"
    with pytest.raises(GraphError, match="bf16 already"):
        with_precision(graph, "fp32")
    assert "precision" in ModelOptions().differences(ModelOptions(precision="bf16"))[0]


def _autocast_training(model, make_opt, loss_fn, data) -> list[float]:
    """Plain PyTorch bf16 training as users write it."""
    opt = make_opt(model.parameters())
    model.train()
    losses = []
    for x, y in data:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def _relative(a: list[float], b: list[float]) -> float:
    x, y = torch.tensor(a), torch.tensor(b)
    return float(((x - y).abs() / y.abs()).max())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_trainer_in_bf16_follows_pytorch_autocast_training(name, tmp_path):
    make, loss_fn = MODELS[name]
    torch.manual_seed(0)
    reference = make()
    ours, fp32 = copy.deepcopy(reference), copy.deepcopy(reference)
    data = batches(name, 20)
    make_opt = OPTIMIZERS["adamw"]
    want = _autocast_training(reference, make_opt, loss_fn, data)
    full, _ = torch_training(fp32, make_opt, loss_fn, data)
    got, opt, trainer = trainer_training(ours, make_opt, loss_fn, data, ratio="2:1",
                                         plans_dir=tmp_path, precision="bf16")
    assert trainer.graph.meta["precision"] == "bf16"
    assert _relative(got, want) <= LOSS_RTOL, (got, want)
    # bf16 for real: closer to autocast's curve than to fp32 training's
    assert _relative(got, want) < _relative(got, full), (got, want, full)
    assert all(p.dtype == torch.float32 for p in ours.parameters())
    assert all(v.dtype == torch.float32 for s in opt.state.values() for v in s.values()
               if v.is_floating_point())


def _optimize(tmp_path, capsys, precision: str) -> dict:
    plan = tmp_path / f"{precision}.json"
    code = main(["optimize", "resnet50", "--batch", "4", "--training", "--precision", precision,
                 "--ratio", "1:0", "--no-baselines", "--time-limit", "10", "--json", "-o",
                 str(plan)])
    assert code == 0
    return {**json.loads(capsys.readouterr().out), "plan": json.loads(plan.read_text())}


def test_precision_through_the_cli(tmp_path, capsys, fp32_only_shipped):
    fp32, bf16 = _optimize(tmp_path, capsys, "fp32"), _optimize(tmp_path, capsys, "bf16")
    assert bf16["plan"]["header"]["model"]["precision"] == "bf16"
    # priced with fp32 profiles only: the plan says so (and the fp32 plan does not)
    said = "bf16 kernels priced from fp32 profiles"
    assert any(said in n for n in bf16["plan"]["header"]["notes"])
    assert not any(said in n for n in fp32["plan"]["header"]["notes"])
    assert bf16["fast_peak_bytes"] < 0.8 * fp32["fast_peak_bytes"]
    assert main(["inspect", "resnet50", "--batch", "2", "--training", "--precision", "bf16",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["precision"] == "bf16" and report["dtypes"]["bfloat16"]["bytes"] > 0
    assert main(["inspect", "resnet50", "--batch", "2", "--precision", "bf16"]) == 0
    assert "precision    bf16 (" in capsys.readouterr().out
    assert main(["inspect", "resnet50", "--precision", "fp16"]) == 2


def test_a_bf16_chunked_loss_trains_as_the_unchunked_bf16_loss(tmp_path):
    """--loss-chunks under bf16: the head is found behind the fp32 Cast autocast puts before
    the loss; the chunked kernel multiplies in bf16 and takes the loss in fp32, so its losses
    are the unchunked bf16 Trainer's within bf16 tolerance (measured: 4e-5 relative)."""
    torch.manual_seed(3)
    plain_model = TinyLM()
    chunked_model = copy.deepcopy(plain_model)
    data = batches("lm", 3)
    make_opt = OPTIMIZERS["adamw"]
    plain, _, _ = trainer_training(plain_model, make_opt, lm_loss, data, ratio="1:0",
                                   plans_dir=tmp_path, precision="bf16")
    chunked, _, trainer = trainer_training(chunked_model, make_opt, lm_loss, data, ratio="1:0",
                                           plans_dir=tmp_path, precision="bf16", loss_chunks=4)
    training = trainer.graph.meta["training"]
    assert training["loss_chunks"] == 4 and training["head"]["weight"] == "emb.weight"
    assert training["head"]["tied"]
    g = trainer.graph
    (kernel,) = [k for k in g.kernels if k.op_type == "LinearCrossEntropy"]
    assert [g.tensors[t].dtype for t in kernel.inputs[:2]] == [BF16, BF16]
    assert [g.tensors[t].dtype for t in kernel.outputs] == [FP32_DTYPE, FP32_DTYPE]
    assert not any(t.shape[-1:] == (64,) and len(t.shape) == 3 for t in g.tensors), \
        "the logits exist whole"
    assert _relative(chunked, plain) <= LOSS_RTOL, (chunked, plain)


def _bf16_lm_training(fused: bool) -> TensorGraph:
    """The bf16 training graph of the small tied-head language model (`tiny_decoder`)."""
    forward = fuse_graph(tiny_decoder()) if fused else tiny_decoder()
    return derive_training(with_precision(forward, "bf16"), optimizer="sgd")


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_the_bf16_loss_reads_the_bf16_logits_with_no_cast_around_it(fused):
    """Issue 46: the unchunked loss reads the head's bf16 logits itself (the fp32 Cast that
    `ir.precision` puts after the head is dropped), computes its loss and log-probabilities in
    fp32, and writes the logits' gradient in bf16 for the head's backward (no CastGrad)."""
    g = _bf16_lm_training(fused)
    training = g.meta["training"]
    loss = g.kernels[training["loss_kernel"]]
    assert loss.op_type == "SoftmaxCrossEntropy"
    assert not fused or training["head"]["tied"]  # the fused Linear by the tied embedding
    logits = g.tensors[loss.inputs[0]]
    assert logits.dtype == BF16
    assert g.kernels[logits.producer].op_type == ("Linear" if fused else "MatMul")
    assert [g.kernels[u].op_type for u in logits.users] == ["SoftmaxCrossEntropy"]
    assert [g.tensors[t].dtype for t in loss.outputs] == [FP32_DTYPE, FP32_DTYPE]
    (grad,) = [k for k in g.kernels if k.op_type == "SoftmaxCrossEntropyGrad"]
    assert grad.inputs[0] == loss.outputs[1] and grad.attr("to") == BF16
    dlogits = g.tensors[grad.outputs[0]]
    assert dlogits.dtype == BF16 and dlogits.shape == logits.shape
    assert "CastGrad" not in {g.kernels[u].op_type for u in dlogits.users}
    # no tensor of the logits' shape in fp32 but the log-probabilities
    wide = [t.name for t in g.tensors if t.shape == logits.shape and t.dtype == FP32_DTYPE]
    assert wide == [g.name_of(loss.outputs[1])]
    # torch's upcast copy inside the loss is its workspace; the gradient's kernel on CUDA reads
    # the log-probabilities once and writes bf16 (`kernels.loss_grad`): none
    assert loss.workspace_bytes == logits.nbytes * 2
    assert grad.workspace_bytes == 0


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_the_bf16_loss_and_logits_gradient_equal_autocast_and_autograd(fused):
    """One step on the CPU: our loss and the logits' bf16 gradient against
    `torch.autocast("cpu", bfloat16)` + torch.autograd of cross-entropy on the same bf16
    logits (autocast runs cross_entropy in fp32 and hands back a bf16 gradient), within
    LOSS_RTOL; and the kernels' direct (`out=`) forms write the same bits."""
    from autotm_py.kernels import run_kernel, run_kernel_into

    g = _bf16_lm_training(fused)
    loss_kernel = g.kernels[g.meta["training"]["loss_kernel"]]
    (grad_kernel,) = [k for k in g.kernels if k.op_type == "SoftmaxCrossEntropyGrad"]
    values = init_values(g, seed=4)
    values = {**values, **run_graph(g, values, keep=range(len(g.tensors)))}
    logits, labels = (values[t] for t in loss_kernel.inputs)
    x = logits.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = F.cross_entropy(x.reshape(-1, x.shape[-1]), labels.reshape(-1))
    want.backward()
    got, dlogits = values[loss_kernel.outputs[0]], values[grad_kernel.outputs[0]]
    assert got.dtype == want.dtype == torch.float32
    assert dlogits.dtype == x.grad.dtype == torch.bfloat16
    assert _relative([got.item()], [want.item()]) <= LOSS_RTOL
    scale = x.grad.float().abs().max().item()
    torch.testing.assert_close(dlogits.float(), x.grad.float(), rtol=LOSS_RTOL,
                               atol=LOSS_RTOL * scale)
    for kernel in (loss_kernel, grad_kernel):
        args = [values[t] for t in kernel.inputs]
        outs = [torch.empty(g.tensors[t].shape, dtype=getattr(torch, g.tensors[t].dtype))
                for t in kernel.outputs]
        assert run_kernel_into(kernel, args, outs), kernel.name
        for a, b in zip(outs, run_kernel(kernel, args), strict=True):
            assert torch.equal(a, b), kernel.name


def test_fifty_bf16_trainer_steps_follow_autocast_training(tmp_path):
    """Issue 46, acceptance 4: 50 steps of Trainer(precision="bf16") on the CPU follow
    torch.autocast("cpu", bfloat16) training's loss curve (every step within LOSS_RTOL), and
    stay closer to it than fp32 training's curve does."""
    torch.manual_seed(5)
    reference = MLP()
    ours, fp32 = copy.deepcopy(reference), copy.deepcopy(reference)
    data = batches("mlp", 50)
    make_opt = OPTIMIZERS["adamw"]
    want = _autocast_training(reference, make_opt, F.cross_entropy, data)
    full, _ = torch_training(fp32, make_opt, F.cross_entropy, data)
    got, _, trainer = trainer_training(ours, make_opt, F.cross_entropy, data, ratio="2:1",
                                       plans_dir=tmp_path, precision="bf16")
    assert trainer.precision == "bf16" and trainer.steps == 50
    assert _relative(got, want) <= LOSS_RTOL, (got, want)
    assert _relative(got, want) < _relative(got, full), (got, want, full)


def _planned_precision(args: list[str], plan, capsys) -> str:
    assert main(["optimize", *args, "--training", "--ratio", "1:0", "--no-baselines",
                 "--json", "-o", str(plan)]) == 0
    capsys.readouterr()
    return json.loads(plan.read_text())["header"]["model"]["precision"]


def test_auto_precision_is_the_devices_default_from_one_place(monkeypatch, tmp_path, capsys):
    """--precision auto (every command's default) and Trainer(precision="auto") resolve from
    `options.default_precision`: fp32 on the CPU and in host mode, `GPU_DEFAULT_PRECISION` for
    a GPU (fp32 until bf16 profiles ship; set to bf16 here, as the flip will); a plan records
    the precision and simulate rebuilds its graph in it; fp32 given keeps fp32."""
    from autotm_py import options
    from tests.test_cli_newuser import mlp_onnx

    assert options.default_precision("cpu") == "fp32"
    assert options.default_precision("cuda") == options.GPU_DEFAULT_PRECISION
    assert ModelOptions().precision == "fp32"  # a graph built in Python without a device
    with pytest.raises(ConfigError, match="auto"):
        with_precision(small_cnn(), "auto")
    monkeypatch.setattr(options, "GPU_DEFAULT_PRECISION", "bf16")
    auto = ModelOptions(precision="auto")
    assert auto.on("cuda:1").precision == "bf16" and auto.on("cpu").precision == "fp32"
    assert options.default_precision("cuda", bf16=False) == "fp32"
    assert ModelOptions(precision="fp32").on("cuda").precision == "fp32"
    model = mlp_onnx(tmp_path / "mlp.onnx")
    plan = tmp_path / "plan.json"
    assert _planned_precision([model, "--device", "cpu"], plan, capsys) == "fp32"
    assert _planned_precision([model, "--precision", "fp32"], plan, capsys) == "fp32"
    assert _planned_precision([model], plan, capsys) == "bf16"  # GPU mode, the default
    assert main(["simulate", "--plan", str(plan), "--json"]) == 0  # rebuilt in bf16: valid
    capsys.readouterr()
    assert main(["inspect", model, "--training", "--json"]) == 0  # GPU mode's budgets
    assert json.loads(capsys.readouterr().out)["precision"] == "bf16"


def test_bf16_kernels_are_priced_from_their_fp32_profiles_by_the_roofline_ratio(
        fp32_only_shipped):
    """Issue 46, acceptance 3: a bf16 kernel without a bf16 profile entry whose fp32 form has
    one is priced from it, times the roofline's bf16/fp32 ratio of the two kernels' work (the
    launch cost kept), not by a bare roofline estimate; such kernels are counted and the costs
    carry a note that a plan priced with them repeats. The shipped H100 profile has bf16
    entries of this model since 2026-12-07: the test takes them out (and the H200's file)."""
    from autotm_py import api
    from autotm_py.costs import BORROWED_NOTE
    from autotm_py.profiling.costmodel import OpShape, Roofline
    from autotm_py.profiling.scaling import scale_time
    from autotm_py.profiling.sources import fp32_signature

    options = {"batch": 32, "training": True}  # a batch the shipped H100 profiles measured
    fp32 = api.load_model("resnet50", ModelOptions(**options))
    bf16 = api.load_model("resnet50", ModelOptions(**options, precision="bf16"))
    c32, c16 = api.load_costs(fp32, device="cuda"), api.load_costs(bf16, device="cuda")
    assert c32.n_precision_scaled == 0 and c32.precision_note() is None
    assert c16.n_precision_scaled > 0
    # only the casts, which have no fp32 form, are not priced from the H100's fp32 entries:
    # they are roofline estimates, or the shipped H200 bf16 entries where those measured them
    # (borrowed from another GPU, said in a note)
    casts = [k for k in bf16.kernels if k.op_type in ("Cast", "CastGrad")]
    assert {k.op_type for k in bf16.kernels if c16.estimated[k.id]} <= {"Cast", "CastGrad"}
    assert c16.n_borrowed <= len(casts)
    assert c16.n_borrowed + sum(c16.estimated[k.id] for k in casts) == len(casts)
    assert fp32_signature(next(k for k in bf16.kernels if k.op_type == "Cast").signature) \
        is None
    # the loss on bf16 logits and its bf16 gradient (`to`): priced from the fp32 loss's entries
    for op in ("SoftmaxCrossEntropy", "SoftmaxCrossEntropyGrad"):
        low = next(k for k in bf16.kernels if k.op_type == op)
        assert fp32_signature(low.signature) == \
            next(k for k in fp32.kernels if k.op_type == op).signature, op
        assert c16.n_precision_scaled and not c16.estimated[low.id], op
    (h100,) = json.loads((fp32_only_shipped / "h100-80gb-hbm3.json").read_text())[
        "sets"].values()
    roofline = Roofline.from_dict(h100["roofline"])
    checked = set()
    for k in bf16.kernels:
        twin = fp32_signature(k.signature)
        entry = h100["entries"].get(twin or "", {}).get("F" * len(k.io))
        if entry is None or k.op_type in checked:
            continue
        measured = roofline.work_s(OpShape.of_signature(twin))
        factor = roofline.work_s(OpShape.of_kernel(bf16, k)) / measured if measured else 1.0
        want = scale_time(entry["median_s"], factor, roofline.launch_s)
        assert c16.times_s[k.id] == pytest.approx(want, rel=1e-9), k.name
        assert not c16.estimated[k.id] and c16.times_s[k.id] <= entry["median_s"], k.name
        checked.add(k.op_type)
    assert {"Conv", "BatchNormalization", "Relu"} <= checked, checked
    note = c16.precision_note()
    assert note is not None and note.startswith(BORROWED_NOTE)  # the Trainer passes it on
    assert f"{c16.n_precision_scaled} of {len(c16.times_s)} kernel times" in note
    assert note in c16.notes()
