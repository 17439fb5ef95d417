"""Whole models train exactly like torch.autograd: a small CNN and a tiny transformer decoder,
built with GraphBuilder as the importer would, checked over 3 SGD and 3 Adam steps (loss,
forward output, every weight gradient, updated weights, Adam state, BN running statistics)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from autotm_py.ir import GraphBuilder, Role, TensorGraph
from autotm_py.runtime.reference import train_steps
from tests.test_training_ops import compare_training


class Net:
    """A tiny model-building helper over GraphBuilder (shapes given by the caller)."""

    def __init__(self, name: str) -> None:
        self.b = GraphBuilder(name)
        self.n = 0

    def tensor(self, shape: tuple[int, ...], role: Role = Role.ACTIVATION,
               dtype: str = "float32", name: str | None = None) -> int:
        self.n += 1
        tid = self.b.add_tensor(name or f"t{self.n}", shape, dtype, role)
        if role == Role.INPUT:
            self.b.inputs.append(tid)
        return tid

    def weight(self, *shape: int) -> int:
        return self.tensor(shape, Role.WEIGHT, name=f"w{self.n + 1}")

    def op(self, op: str, inputs: list[int], out_shape: tuple[int, ...], /,
           **attrs: object) -> int:
        out = self.tensor(out_shape)
        self.b.add_kernel(op, inputs, [out], attrs=attrs)
        return out

    def ops(self, op: str, inputs: list[int], shapes: list[tuple[int, ...]], /,
            **attrs: object) -> list[int]:
        outs = [self.tensor(s) for s in shapes]
        self.b.add_kernel(op, inputs, outs, attrs=attrs)
        return outs

    def build(self, output: int) -> TensorGraph:
        self.b.outputs.append(output)
        return self.b.build()


def _conv_bn_relu(net: Net, x: int, cin: int, cout: int, hw: int, k: int = 3,
                  relu: bool = True, n: int = 2) -> int:
    pad = k // 2
    c = net.op("Conv", [x, net.weight(cout, cin, k, k)], (n, cout, hw, hw),
               kernel_shape=(k, k), pads=(pad,) * 4, strides=(1, 1), dilations=(1, 1), group=1)
    bn = net.op("BatchNormalization", [c, net.weight(cout), net.weight(cout), net.weight(cout),
                                       net.weight(cout)], (n, cout, hw, hw), epsilon=1e-5,
                momentum=0.9)
    return net.op("Relu", [bn], (n, cout, hw, hw)) if relu else bn


def small_cnn(n: int = 2, size: int = 16, *, dropout: bool = True,
              name: str = "small_cnn") -> TensorGraph:
    """conv-bn-relu, maxpool, a residual block, a two-branch concat, avgpool, global pool,
    dropout (unless `dropout` is False) and a Gemm classifier; `n` images of `size` x `size`
    (a multiple of 4)."""
    net = Net(name)
    half, quarter = size // 2, size // 4
    x = net.tensor((n, 3, size, size), Role.INPUT, name="image")
    h = _conv_bn_relu(net, x, 3, 8, size, n=n)
    h = net.op("MaxPool", [h], (n, 8, half, half), kernel_shape=(2, 2), strides=(2, 2))
    r = _conv_bn_relu(net, h, 8, 8, half, n=n)
    r = _conv_bn_relu(net, r, 8, 8, half, relu=False, n=n)
    h = net.op("Relu", [net.op("Add", [r, h], (n, 8, half, half))], (n, 8, half, half))
    a = _conv_bn_relu(net, h, 8, 4, half, k=1, n=n)
    b = _conv_bn_relu(net, h, 8, 6, half, n=n)
    h = net.op("Concat", [a, b, h], (n, 18, half, half), axis=1)
    h = net.op("AveragePool", [h], (n, 18, quarter, quarter), kernel_shape=(3, 3),
               strides=(2, 2), pads=(1, 1, 1, 1), count_include_pad=0)
    h = net.op("GlobalAveragePool", [h], (n, 18, 1, 1))
    h = net.op("Flatten", [h], (n, 18), axis=1)
    if dropout:
        h = net.op("Dropout", [h], (n, 18), ratio=0.25)
    return net.build(net.op("Gemm", [h, net.weight(10, 18), net.weight(10)], (n, 10),
                            transB=1))


def _layer_norm(net: Net, x: int, shape: tuple[int, ...]) -> int:
    d = shape[-1]
    return net.op("LayerNormalization", [x, net.weight(d), net.weight(d)], shape, axis=-1,
                  epsilon=1e-5)


def _attention(net: Net, x: int, batch: int, seq: int, d: int, heads: int) -> int:
    dh = d // heads
    # no QKV bias: the key bias has an exactly-zero gradient (softmax is shift invariant),
    # which Adam would turn into rounding-noise-sized updates of order lr
    qkv = net.op("MatMul", [x, net.weight(d, 3 * d)], (batch, seq, 3 * d))
    q, k, v = net.ops("Split", [qkv], [(batch, seq, d)] * 3, axis=-1, split=(d, d, d))
    split = (batch, seq, heads, dh)
    q, k, v = (net.op("Reshape", [t], split, shape=(0, 0, heads, dh)) for t in (q, k, v))
    q = net.op("Transpose", [q], (batch, heads, seq, dh), perm=(0, 2, 1, 3))
    k = net.op("Transpose", [k], (batch, heads, dh, seq), perm=(0, 2, 3, 1))
    v = net.op("Transpose", [v], (batch, heads, seq, dh), perm=(0, 2, 1, 3))
    scores = net.op("MatMul", [q, k], (batch, heads, seq, seq))
    scale = net.b.add_constant("scale", np.array(dh ** -0.5, dtype=np.float32))
    scores = net.op("Mul", [scores, scale], (batch, heads, seq, seq))
    causal = net.b.add_constant("causal", np.tril(np.ones((seq, seq), dtype=bool)))
    masked = net.b.add_constant("masked", np.array(-1e9, dtype=np.float32))
    scores = net.op("Where", [causal, scores, masked], (batch, heads, seq, seq))
    probs = net.op("Softmax", [scores], (batch, heads, seq, seq), axis=-1)
    ctx = net.op("MatMul", [probs, v], (batch, heads, seq, dh))
    ctx = net.op("Transpose", [ctx], (batch, seq, heads, dh), perm=(0, 2, 1, 3))
    ctx = net.op("Reshape", [ctx], (batch, seq, d), shape=(batch, seq, d))
    return net.op("MatMul", [ctx, net.weight(d, d)], (batch, seq, d))


def _erf_gelu(net: Net, x: int, shape: tuple[int, ...]) -> int:
    """x * 0.5 * (1 + erf(x / sqrt 2)), the way exporters spell Gelu before opset 20."""
    sqrt2 = net.b.add_constant("sqrt2", np.array(np.sqrt(2.0), dtype=np.float32))
    one = net.b.add_constant("one", np.array(1.0, dtype=np.float32))
    half = net.b.add_constant("half", np.array(0.5, dtype=np.float32))
    e = net.op("Erf", [net.op("Div", [x, sqrt2], shape)], shape)
    return net.op("Mul", [net.op("Mul", [x, net.op("Add", [e, one], shape)], shape), half],
                  shape)


def tiny_decoder(batch: int = 2, seq: int = 6, vocab: int = 11, d: int = 8,
                 heads: int = 2) -> TensorGraph:
    """Token + position embedding, one pre-LN decoder block (causal attention via Where,
    erf-GELU MLP), final LN, the last seq-1 positions sliced, logits through the tied
    embedding (so its gradient accumulates from Gather and MatMul)."""
    net = Net("tiny_decoder")
    shape = (batch, seq, d)
    tokens = net.tensor((batch, seq), Role.INPUT, "int64", name="tokens")
    emb = net.weight(vocab, d)
    h = net.op("Gather", [emb, tokens], shape, axis=0)
    h = net.op("Add", [h, net.weight(seq, d)], shape)
    h = net.op("Add", [h, _attention(net, _layer_norm(net, h, shape), batch, seq, d, heads)],
               shape)
    m = net.op("MatMul", [_layer_norm(net, h, shape), net.weight(d, 4 * d)], (batch, seq, 4 * d))
    m = net.op("Add", [m, net.weight(4 * d)], (batch, seq, 4 * d))
    m = _erf_gelu(net, m, (batch, seq, 4 * d))
    h = net.op("Add", [h, net.op("MatMul", [m, net.weight(4 * d, d)], shape)], shape)
    h = _layer_norm(net, h, shape)
    h = net.op("Slice", [h], (batch, seq - 1, d), starts=(1,), ends=(seq,), axes=(1,))
    emb_t = net.op("Transpose", [emb], (d, vocab), perm=(1, 0))
    return net.build(net.op("MatMul", [h, emb_t], (batch, seq - 1, vocab)))


MODELS = {"small_cnn": small_cnn, "tiny_decoder": tiny_decoder}


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_model_trains_like_autograd(model: str, optimizer: str) -> None:
    graph = MODELS[model]()
    train = compare_training(graph, steps=3, optimizer=optimizer)
    ops = {k.op_type for k in train.kernels}
    assert "GradAccumulate" in ops  # residual adds / tied embedding have several users
    n_weights = sum(1 for t in graph.tensors if t.role == Role.WEIGHT)
    trained = len(train.meta["training"]["weight_grads"])
    expected_frozen = 2 * sum(1 for k in graph.kernels if k.op_type == "BatchNormalization")
    assert trained == n_weights - expected_frozen  # running mean/var are not trained


@pytest.mark.parametrize("model", sorted(MODELS))
def test_two_runs_are_bitwise_equal(model: str) -> None:
    """Same seed, same kernels: identical bits (what the plan executor must keep)."""
    from autotm_py.ir.training import derive_training

    train = derive_training(MODELS[model](), optimizer="adam")
    first = train_steps(train, steps=2, seed=5)
    second = train_steps(train, steps=2, seed=5)
    for a, b in zip(first, second, strict=True):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[t], b[t]) for t in a)
