"""VGG19 (Simonyan & Zisserman 2015, configuration E) and AutoTM's 416-layer VGG416.

Both: 3x3 convolutions with bias and ReLU in five stacks, a 2x2 max pool after each, then
Linear(25088, 4096) -> ReLU -> Linear(4096, 4096) -> ReLU -> Linear(4096, 1000). No dropout (the
zoo graphs carry no stochastic ops) and no ReLU on the logits (AutoTM's Flux VGG19 had one,
followed by a log/softmax guard; ours ends in plain logits like torchvision's).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from autotm_py.frontend.zoo.layers import Act, NetBuilder, conv, gemm, image_input, pool, relu

# Each stack: the convolutions' output channels, in order; a max pool follows every stack.
VGG19_STACKS: tuple[tuple[int, ...], ...] = (
    (64, 64), (128, 128), (256,) * 4, (512,) * 4, (512,) * 4)


def vgg416_stacks() -> tuple[tuple[int, ...], ...]:
    """AutoTM's vgg416: stacks of 1+80+1, 81+1, 82+1, 83 and 83 convolutions (413 in all).

    Each of the first three stacks ends with the convolution that widens to the next stack's
    channels (64->128, 128->256, 256->512), as in AutoTM's zoo/vgg.jl.
    """
    return ((64,) * 81 + (128,), (128,) * 81 + (256,), (256,) * 82 + (512,),
            (512,) * 83, (512,) * 83)


def _features(b: NetBuilder, x: Act, stacks: Sequence[Sequence[int]]) -> Act:
    index = 0
    for channels in stacks:
        for cout in channels:
            x = relu(b, conv(b, x, cout, 3, bias=True, name=f"features.{index}"))
            index += 1
        x = pool(b, x, "max", 2, 2)
    return x


def _vgg(name: str, stacks: Sequence[Sequence[int]], batch: int, doc: str) -> onnx.ModelProto:
    b = NetBuilder(name)
    x = _features(b, image_input(b, 224), stacks)
    h = b.op("Flatten", x.name, axis=1)  # (batch, 512 * 7 * 7)
    h = b.op("Relu", gemm(b, h, x.ch * 7 * 7, 4096, name="classifier.0"))
    h = b.op("Relu", gemm(b, h, 4096, 4096, name="classifier.1"))
    b.add_output(gemm(b, h, 4096, 1000, name="classifier.2"), "logits", ["batch", 1000])
    return b.build({"batch": batch}, doc)


def vgg19(batch: int) -> onnx.ModelProto:
    return _vgg("vgg19", VGG19_STACKS, batch, "VGG19 (configuration E), 224x224, 1000 classes")


def vgg416(batch: int) -> onnx.ModelProto:
    return _vgg("vgg416", vgg416_stacks(), batch,
                "AutoTM's VGG416: 413 3x3 convolutions + 3 Linear layers, 224x224")
