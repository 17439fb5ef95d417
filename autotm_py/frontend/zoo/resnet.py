"""ResNet-50 and ResNet-200 (He et al. 2016) with bottleneck blocks, 224x224, 1000 classes.

torchvision's layout ("v1.5"): the stride of a stage's first block sits on its 3x3
convolution; a 1x1 convolution + BatchNorm projects the shortcut where the shape changes.
Stage depths [3, 4, 6, 3] (ResNet-50) and [3, 24, 36, 3] (ResNet-200), as AutoTM's Metalhead
models. Where the stride sits changes no parameter count and no tensor shape.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from autotm_py.frontend.zoo.layers import (
    Act,
    NetBuilder,
    classifier_head,
    conv_bn,
    image_input,
    pool,
    relu,
)

EXPANSION = 4
STAGE_WIDTHS = (64, 128, 256, 512)


def bottleneck(b: NetBuilder, x: Act, planes: int, stride: int) -> Act:
    """1x1 (planes) -> 3x3 (planes, stride) -> 1x1 (4 planes), + shortcut, ReLU."""
    y = conv_bn(b, x, planes, 1, name="conv1")
    y = conv_bn(b, y, planes, 3, stride=stride, name="conv2")
    y = conv_bn(b, y, planes * EXPANSION, 1, act=False, zero_gamma=True, name="conv3")
    shortcut = x
    if stride != 1 or x.ch != planes * EXPANSION:
        shortcut = conv_bn(b, x, planes * EXPANSION, 1, stride=stride, act=False,
                           name="downsample")
    return relu(b, Act(b.op("Add", y.name, shortcut.name), y.ch))


def _resnet(name: str, depths: Sequence[int], batch: int) -> onnx.ModelProto:
    b = NetBuilder(name)
    x = conv_bn(b, image_input(b, 224), 64, 7, stride=2, name="stem")
    x = pool(b, x, "max", 3, 2, pad=1)
    for stage, (planes, depth) in enumerate(zip(STAGE_WIDTHS, depths, strict=True)):
        for index in range(depth):
            stride = 2 if index == 0 and stage > 0 else 1
            with b.scope(f"layer{stage + 1}.{index}"):
                x = bottleneck(b, x, planes, stride)
    classifier_head(b, x)
    doc = f"ResNet with bottleneck blocks {list(depths)}, 224x224, 1000 classes"
    return b.build({"batch": batch}, doc)


def resnet50(batch: int) -> onnx.ModelProto:
    return _resnet("resnet50", (3, 4, 6, 3), batch)


def resnet200(batch: int) -> onnx.ModelProto:
    return _resnet("resnet200", (3, 24, 36, 3), batch)
