"""Structure of the derived training graph: order, roles, carried pairs, pruning, errors."""

from __future__ import annotations

import numpy as np
import pytest

from autotm_py import api
from autotm_py.errors import ConfigError, GraphError, UnsupportedOpError
from autotm_py.ir import GraphBuilder, Role, TensorGraph
from autotm_py.ir.training import derive_training
from tests.test_training_models import Net, small_cnn, tiny_decoder


def test_forward_part_is_kept_and_loss_added() -> None:
    fwd = small_cnn()
    train = derive_training(fwd)
    meta = train.meta["training"]
    n = len(fwd.kernels)
    assert [k.op_type for k in train.kernels[:n]] == [k.op_type for k in fwd.kernels]
    assert [k.name for k in train.kernels[:n]] == [k.name for k in fwd.kernels]
    assert [t.name for t in train.tensors[: len(fwd.tensors)]] == [t.name for t in fwd.tensors]
    loss = train.kernels[n]
    assert (loss.op_type, loss.domain, meta["loss_kernel"]) == ("SoftmaxCrossEntropy",
                                                                "autotm", n)
    assert train.tensors[meta["loss"]].role == Role.OUTPUT
    assert train.tensors[meta["labels"]].role == Role.LABEL
    assert train.tensors[meta["labels"]].shape == (2,)
    assert meta["labels"] in train.inputs
    assert train.tensors[fwd.outputs[0]].role == Role.ACTIVATION  # logits no longer an output


def _forward_of(train: TensorGraph) -> dict[str, int]:
    return {k.name: k.id for k in train.kernels[: train.meta["training"]["forward_kernels"]]}


def test_backward_runs_in_reverse_forward_order() -> None:
    train = derive_training(tiny_decoder())
    forward = _forward_of(train)
    order = [forward[k.name.split("/")[0]] for k in train.kernels
             if k.domain == "autotm" and k.name.split("/")[0] in forward]
    assert order == sorted(order, reverse=True)


def test_roles_carried_and_outputs_for_adam() -> None:
    train = derive_training(small_cnn(), optimizer="adam", learning_rate=0.001)
    meta = train.meta["training"]
    steps = [k for k in train.kernels if k.op_type == "AdamStep"]
    updates = [k for k in train.kernels if k.op_type == "AdamUpdate"]
    assert len(steps) == 1 and len(updates) == len(meta["weight_grads"])
    assert all(u.id > steps[0].id and u.inputs[4] == steps[0].outputs[1] for u in updates)
    for w, g in meta["weight_grads"]:
        assert train.tensors[w].role == Role.WEIGHT
        assert train.tensors[g].role == Role.WEIGHT_GRADIENT
    for u in updates:
        w, _, m, v, _ = u.inputs
        assert [train.tensors[t].role for t in (m, v)] == [Role.OPTIMIZER_STATE] * 2
        assert {(w, u.outputs[0]), (m, u.outputs[1]), (v, u.outputs[2])} <= set(train.carried)
        assert u.attr("lr") == 0.001
    assert set(train.outputs) == {meta["loss"]} | {last for _, last in train.carried}
    bn_stats = [k.outputs[1:3] for k in train.kernels if k.op_type == "BatchNormalization"]
    assert all(set(s) <= set(train.outputs) for s in bn_stats)
    activation_grads = {t.role for t in train.tensors if t.name.startswith("grad::t")}
    assert activation_grads == {Role.GRADIENT}


def test_no_gradients_for_inputs_constants_and_integers() -> None:
    train = derive_training(small_cnn())
    first_conv = train.kernels[0].name
    assert not any(k.op_type == "ConvGradData" and k.name.startswith(first_conv + "/")
                   for k in train.kernels)
    no_grad = {t.name for t in train.tensors if t.role in (Role.INPUT, Role.CONSTANT)
               or t.dtype != "float32"}
    assert not any(t.name.removeprefix("grad::") in no_grad for t in train.tensors
                   if t.name.startswith("grad::"))
    decoder = derive_training(tiny_decoder())
    assert not any(t.name == "grad::tokens" for t in decoder.tensors)


def test_unused_branches_get_no_backward_and_no_update() -> None:
    net = Net("branch")
    x = net.tensor((2, 4), Role.INPUT, name="x")
    used = net.op("MatMul", [x, net.weight(4, 3)], (2, 3))
    side_w = net.weight(4, 5)
    side = net.op("MatMul", [x, side_w], (2, 5))
    net.b.outputs = [used, side]  # the loss goes on the first output only
    train = derive_training(net.b.build())
    assert side_w not in dict(train.meta["training"]["weight_grads"])
    assert len(train.meta["training"]["weight_grads"]) == 1
    assert sum(k.op_type.startswith("MatMulGrad") for k in train.kernels) == 1


def test_existing_loss_is_used() -> None:
    net = Net("with_loss")
    x = net.tensor((3, 4), Role.INPUT, name="x")
    labels = net.tensor((3,), Role.INPUT, "int64", name="y")
    logits = net.op("Gemm", [x, net.weight(4, 5)], (3, 5))
    loss = net.op("SoftmaxCrossEntropyLoss", [logits, labels], (), reduction="mean")
    train = derive_training(net.build(loss))
    meta = train.meta["training"]
    assert meta["loss"] == loss and meta["labels"] == labels
    assert train.tensors[labels].role == Role.LABEL
    assert sum(k.op_type.startswith("SoftmaxCrossEntropy") for k in train.kernels) == 2
    assert len(train.kernels[meta["loss_kernel"]].outputs) == 2  # log_prob saved


def test_training_mode_rewrites_of_dropout_and_batchnorm() -> None:
    train = derive_training(small_cnn())
    drop = next(k for k in train.kernels if k.op_type == "Dropout")
    assert drop.attr("training_mode") == 1 and drop.attr("seed") is None  # signature kept
    assert train.tensors[drop.outputs[1]].dtype == "bool"
    assert any(k.op_type == "DropoutGrad" and drop.outputs[1] in k.inputs
               for k in train.kernels)
    bn = next(k for k in train.kernels if k.op_type == "BatchNormalization")
    assert len(bn.outputs) == 5 and bn.attr("training_mode") == 1
    grad = next(k for k in train.kernels if k.name == f"{bn.name}/grad")
    assert grad.op_type == "BatchNormGrad"
    assert grad.inputs[3:] == tuple(bn.outputs[3:])  # reads the saved statistics
    assert (bn.inputs[3], bn.outputs[1]) in train.carried


def test_relu_grad_reads_relu_output_and_conv_grads_are_one_kernel() -> None:
    train = derive_training(small_cnn())
    relu = next(k for k in train.kernels if k.op_type == "Relu")
    relu_grad = next(k for k in train.kernels if k.name == f"{relu.name}/grad")
    assert relu_grad.op_type == "ReluGrad" and relu_grad.inputs[1] == relu.outputs[0]
    conv = next(k for k in train.kernels if k.op_type == "Conv" and k.id > 0)
    (grad,) = [k for k in train.kernels if k.name.startswith(conv.name + "/")]
    # one convolution backward for dX and dW (and dB), reading dY, X and W
    assert grad.op_type == "ConvGrad" and grad.name == f"{conv.name}/grad"
    assert grad.inputs[1:] == conv.inputs[:2]
    assert [train.tensors[t].name.removesuffix("::part") for t in grad.outputs] == \
        [f"grad::{train.tensors[t].name}" for t in conv.inputs]
    assert grad.attr("output_mask") == (1, 1, int(len(conv.inputs) > 2))
    # the first conv's input needs no gradient: its filter gets a ConvGradFilter alone
    first = train.kernels[0]
    kinds = {k.op_type for k in train.kernels if k.name.startswith(first.name + "/")}
    assert kinds == {"ConvGradFilter"} | ({"ConvGradBias"} if len(first.inputs) > 2 else set())


def test_conv_grad_memory_accounting() -> None:
    """ConvGrad reads dY, X and W and writes dX, dW, dB at once: its working set is the
    union of what ConvGradData, ConvGradFilter and ConvGradBias read and wrote, the tensors
    live at it are those that were live at the last of them (so the peak is unchanged), and
    dY, X and W die there when nothing later reads them."""
    net = Net("convs")
    x = net.tensor((2, 3, 8, 8), Role.INPUT, name="x")
    c1 = net.op("Conv", [x, net.weight(4, 3, 3, 3)], (2, 4, 8, 8), pads=(1, 1, 1, 1))
    w2, b2 = net.weight(6, 4, 3, 3), net.weight(6)
    c2 = net.op("Conv", [c1, w2, b2], (2, 6, 4, 4), pads=(1, 1, 1, 1), strides=(2, 2))
    train = derive_training(net.build(net.op("Flatten", [c2], (2, 96), axis=1)))
    (grad,) = [k for k in train.kernels if k.op_type == "ConvGrad"]
    dy, xin, w = grad.inputs
    assert (xin, w) == (c1, w2)
    nbytes = train.tensor_bytes
    assert [int(nbytes[t]) for t in grad.outputs] == [2 * 4 * 8 * 8 * 4, 6 * 4 * 9 * 4, 6 * 4]
    assert train.working_set_bytes[grad.id] == sum(int(nbytes[t]) for t in grad.io)
    ranges = train.live_ranges
    assert ranges[dy][1] == grad.id and ranges[xin][1] == grad.id  # last read here
    assert all(ranges[t][0] == grad.id for t in grad.outputs)  # born here
    live = set(train.live_at(grad.id))
    assert set(grad.io) <= live
    assert train.live_bytes[grad.id] == sum(int(nbytes[t]) for t in live)
    # the first conv's input is the image: only its filter gradient is computed
    assert [k.op_type for k in train.kernels if k.name.startswith(train.kernels[0].name)
            and k.domain == "autotm"] == ["ConvGradFilter"]


def test_errors_name_the_problem() -> None:
    b = GraphBuilder("odd")
    x = b.add_tensor("x", (2, 3), "float32", Role.WEIGHT)
    y = b.add_tensor("y", (2, 3), "float32", Role.OUTPUT)
    b.add_kernel("Softplus", [x], [y], name="sp")
    b.outputs.append(y)
    with pytest.raises(UnsupportedOpError, match=r"Softplus.*--training"):
        derive_training(b.build())
    b = GraphBuilder("odder")  # every unsupported op type, with its count
    x = b.add_tensor("x", (2, 3), "float32", Role.WEIGHT)
    prev = x
    for i, op in enumerate(("Softplus", "Softsign", "Softplus")):
        out = b.add_tensor(f"t{i}", (2, 3), "float32", Role.ACTIVATION)
        b.add_kernel(op, [prev], [out], name=f"k{i}")
        prev = out
    b.outputs.append(prev)
    with pytest.raises(UnsupportedOpError, match=r"3 nodes of 2 op types.*'Softplus' x2.*"
                                                 r"'Softsign' x1"):
        derive_training(b.build())
    with pytest.raises(ConfigError, match="optimizer 'lamb'"):
        derive_training(small_cnn(), optimizer="lamb")
    with pytest.raises(ConfigError, match="learning rate"):
        derive_training(small_cnn(), learning_rate=-1.0)
    with pytest.raises(GraphError, match="already a training graph"):
        derive_training(derive_training(small_cnn()))


def test_loss_needs_a_float_output_and_blocked_outputs_fail() -> None:
    net = Net("int_out")
    x = net.tensor((2, 3), Role.WEIGHT, name="x")
    y = net.tensor((2, 3), dtype="int64", name="y")
    net.b.add_kernel("Cast", [x], [y], attrs={"to": "int64"})
    with pytest.raises(GraphError, match="no float output"):
        derive_training(net.build(y))
    net = Net("ln_mean")
    x = net.tensor((2, 3), Role.WEIGHT, name="x")
    outs = net.ops("LayerNormalization", [x, net.weight(3)], [(2, 3), (2, 1), (2, 1)], axis=-1)
    with pytest.raises(UnsupportedOpError, match="no gradient rule"):
        derive_training(net.build(net.op("Add", [outs[0], outs[1]], (2, 3))))


def test_repeated_blocks_share_signatures_and_api_delegates() -> None:
    train = api.derive_training(tiny_decoder(), optimizer="sgd", learning_rate=0.05)
    assert train.meta["training"]["learning_rate"] == 0.05
    sigs = [k.signature for k in train.kernels if k.op_type == "LayerNormGrad"]
    assert len(sigs) == 3 and len(set(sigs)) == 1
    assert train.peak_live_bytes > tiny_decoder().peak_live_bytes
    assert np.all(train.live_bytes > 0)
