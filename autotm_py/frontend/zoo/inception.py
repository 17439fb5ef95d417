"""Inception-v4 (Szegedy et al. 2017, figures 3-9), 299x299, 1000 classes.

Stem, 4 x Inception-A, Reduction-A with (k, l, m, n) = (192, 224, 256, 384), 7 x Inception-B,
Reduction-B, 3 x Inception-C, 8x8 average pool, Linear(1536, 1000), as in AutoTM's zoo. Every
convolution is Conv (no bias) -> BatchNorm (eps 1e-3) -> ReLU, the common TF/timm form.
Branches are written as small tables: ("max"|"avg") is a 3x3 pool, (cout, kh, kw) a 'same'
convolution, and (cout, kh, kw, "s2"|"v") a stride-2 or stride-1 'valid' one.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from autotm_py.frontend.zoo.layers import (
    Act,
    NetBuilder,
    classifier_head,
    concat,
    conv_bn,
    image_input,
    pool,
)

Spec = tuple  # see the module docstring
Branch = Sequence[Spec]

STEM: tuple[Spec, ...] = ((32, 3, 3, "s2"), (32, 3, 3, "v"), (64, 3, 3))
MIXED_3A: tuple[Branch, ...] = ((("max",),), ((96, 3, 3, "s2"),))
MIXED_4A: tuple[Branch, ...] = (
    ((64, 1, 1), (96, 3, 3, "v")),
    ((64, 1, 1), (64, 1, 7), (64, 7, 1), (96, 3, 3, "v")))
MIXED_5A: tuple[Branch, ...] = (((192, 3, 3, "s2"),), (("max",),))
BLOCK_A: tuple[Branch, ...] = (
    ((96, 1, 1),), ((64, 1, 1), (96, 3, 3)), ((64, 1, 1), (96, 3, 3), (96, 3, 3)),
    (("avg",), (96, 1, 1)))
REDUCTION_A: tuple[Branch, ...] = (
    ((384, 3, 3, "s2"),), ((192, 1, 1), (224, 3, 3), (256, 3, 3, "s2")), (("max",),))
BLOCK_B: tuple[Branch, ...] = (
    ((384, 1, 1),), ((192, 1, 1), (224, 1, 7), (256, 7, 1)),
    ((192, 1, 1), (192, 7, 1), (224, 1, 7), (224, 7, 1), (256, 1, 7)),
    (("avg",), (128, 1, 1)))
REDUCTION_B: tuple[Branch, ...] = (
    ((192, 1, 1), (192, 3, 3, "s2")),
    ((256, 1, 1), (256, 1, 7), (320, 7, 1), (320, 3, 3, "s2")), (("max",),))
# Inception-C: branches 1 and 2 end in a fork of a 1x3 and a 3x1 convolution (256 each).
BLOCK_C_TRUNKS: tuple[Branch, ...] = (
    ((256, 1, 1),), ((384, 1, 1),), ((384, 1, 1), (448, 3, 1), (512, 1, 3)),
    (("avg",), (256, 1, 1)))
FORK: tuple[Spec, Spec] = ((256, 1, 3), (256, 3, 1))
FORKED = (1, 2)  # the trunks that end in FORK


def _layer(b: NetBuilder, x: Act, spec: Spec, name: str) -> Act:
    if spec[0] == "max":
        return pool(b, x, "max", 3, 2)
    if spec[0] == "avg":
        return pool(b, x, "avg", 3, 1, pad=1)
    cout, kh, kw, *mode = spec
    stride = 2 if mode == ["s2"] else 1
    pad = 0 if mode else None
    return conv_bn(b, x, cout, (kh, kw), stride=stride, pad=pad, eps=1e-3, name=name)


def _branch(b: NetBuilder, x: Act, specs: Branch) -> Act:
    for index, spec in enumerate(specs):
        x = _layer(b, x, spec, f"conv{index}")
    return x


def _mixed(b: NetBuilder, x: Act, branches: Sequence[Branch], name: str) -> Act:
    parts = []
    with b.scope(name):
        for index, specs in enumerate(branches):
            with b.scope(f"branch{index}"):
                parts.append(_branch(b, x, specs))
    return concat(b, parts)


def _block_c(b: NetBuilder, x: Act, name: str) -> Act:
    parts = []
    with b.scope(name):
        for index, specs in enumerate(BLOCK_C_TRUNKS):
            with b.scope(f"branch{index}"):
                trunk = _branch(b, x, specs)
                if index in FORKED:
                    parts += [_layer(b, trunk, s, f"fork{j}") for j, s in enumerate(FORK)]
                else:
                    parts.append(trunk)
    return concat(b, parts)


def inception_v4(batch: int) -> onnx.ModelProto:
    b = NetBuilder("inception_v4")
    with b.scope("stem"):
        x = _branch(b, image_input(b, 299), STEM)
    x = _mixed(b, x, MIXED_3A, "mixed_3a")
    x = _mixed(b, x, MIXED_4A, "mixed_4a")
    x = _mixed(b, x, MIXED_5A, "mixed_5a")  # 384 x 35 x 35
    for i in range(4):
        x = _mixed(b, x, BLOCK_A, f"inception_a.{i}")
    x = _mixed(b, x, REDUCTION_A, "reduction_a")  # 1024 x 17 x 17
    for i in range(7):
        x = _mixed(b, x, BLOCK_B, f"inception_b.{i}")
    x = _mixed(b, x, REDUCTION_B, "reduction_b")  # 1536 x 8 x 8
    for i in range(3):
        x = _block_c(b, x, f"inception_c.{i}")
    classifier_head(b, x)  # the paper's 8x8 average pool is global here: the map is 8x8
    return b.build({"batch": batch}, "Inception-v4, 299x299, 1000 classes")
