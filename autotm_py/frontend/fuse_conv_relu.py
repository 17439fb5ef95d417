"""Convolution + ReLU: a Conv whose output only a Relu reads, as one `ConvRelu` kernel.

    Z = Conv(X, W[, B])      (Z read by nothing else, and no graph output)
    Y = Relu(Z)

becomes `ConvRelu(X, W[, B]) -> Y` with Conv's attributes. On CUDA it runs as one cuDNN call
whose epilogue adds the bias and applies the ReLU (`torch.cudnn_convolution_relu`), where the
pair ran three passes over every output element (the convolution, aten's in-place bias add,
the ReLU); elsewhere it runs the convolution and then the ReLU in place. The values are the
unfused pair's bit for bit (docs/fusion.md). VGG-style networks have this pattern at every
convolution; a Conv followed by a normalization (ResNet, DenseNet, Inception-v4) has not.
"""

from __future__ import annotations

from autotm_py.frontend.fuse_base import Matcher, NewKernel, Rewrite
from autotm_py.ir.graph import Kernel
from autotm_py.ir.rules.base import BACKWARD_DOMAIN
from autotm_py.ir.rules.fused import CONV_RELU


def match_conv_relu(m: Matcher, conv: Kernel) -> Rewrite | None:
    if conv.op_type != "Conv" or conv.domain != "" or not m.is_float(conv.outputs[0]):
        return None
    relu = m.sole_user(conv.outputs[0])
    if relu is None or relu.op_type != "Relu" or relu.domain != "":
        return None
    removed = (conv.id, relu.id)
    kernel = NewKernel(CONV_RELU, tuple(conv.inputs), (relu.outputs[0],), conv.attrs_dict,
                       m.kernel_name(removed, CONV_RELU), domain=BACKWARD_DOMAIN,
                       workspace_bytes=conv.workspace_bytes)
    return Rewrite("conv_relu", frozenset(removed), ((relu.id, kernel),))
