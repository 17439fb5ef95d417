"""DenseNet-264 (Huang et al. 2017, DenseNet-BC), growth rate k = 32, 224x224, 1000 classes.

Stem: 7x7/2 convolution to 2k = 64 channels, BatchNorm, ReLU, 3x3/2 max pool. Dense blocks of
(6, 12, 64, 48) layers; a layer is BN-ReLU-Conv1x1(4k)-BN-ReLU-Conv3x3(k) and its k new maps are
concatenated onto its input (one two-input Concat per layer, as AutoTM's Flux model does). The
transition after each of the first three blocks is BN-ReLU-Conv1x1 halving the channels
(compression 0.5) and a 2x2/2 average pool. A final BN-ReLU, global average pool and Linear.

AutoTM's variant differs in its transitions, which cut back to 2k = 64 channels every time
(and it has no final BatchNorm): see docs/zoo.md.
"""

from __future__ import annotations

import onnx

from autotm_py.frontend.zoo.layers import (
    Act,
    NetBuilder,
    batchnorm,
    bn_relu_conv,
    classifier_head,
    concat,
    conv_bn,
    image_input,
    pool,
    relu,
)

GROWTH = 32
BLOCKS = (6, 12, 64, 48)
BOTTLENECK = 4  # the 1x1 convolution makes BOTTLENECK * k maps
COMPRESSION = 0.5


def dense_layer(b: NetBuilder, x: Act, growth: int) -> Act:
    y = bn_relu_conv(b, x, BOTTLENECK * growth, 1, name="conv1")
    y = bn_relu_conv(b, y, growth, 3, name="conv2")
    return concat(b, [x, y])


def transition(b: NetBuilder, x: Act) -> Act:
    y = bn_relu_conv(b, x, int(x.ch * COMPRESSION), 1, name="conv")
    return pool(b, y, "avg", 2, 2)


def densenet264(batch: int, growth: int = GROWTH) -> onnx.ModelProto:
    b = NetBuilder("densenet264")
    x = conv_bn(b, image_input(b, 224), 2 * growth, 7, stride=2, name="stem")
    x = pool(b, x, "max", 3, 2, pad=1)
    for block, layers in enumerate(BLOCKS):
        for index in range(layers):
            with b.scope(f"denseblock{block + 1}.{index}"):
                x = dense_layer(b, x, growth)
        if block < len(BLOCKS) - 1:
            with b.scope(f"transition{block + 1}"):
                x = transition(b, x)
    x = relu(b, batchnorm(b, x, name="norm5"))
    classifier_head(b, x)
    return b.build({"batch": batch}, f"DenseNet-264 (BC, k={growth}), 224x224, 1000 classes")
