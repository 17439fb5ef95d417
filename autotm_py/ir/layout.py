"""Channels-last storage of a CNN's image tensors (`--channels-last`; docs/layout.md).

The IR keeps ONNX's logical N x C x H x W shapes; a tensor's `channels_last` flag says its
bytes are stored N, H, W, C (torch's `channels_last` memory format), which is how cuDNN's
fastest convolution engines on tensor cores want them, with little or no workspace. The flag
changes no size: plans, offsets and the pinned pool are the same bytes, laid out differently.

Which tensors: every rank-4 floating tensor connected to a convolution through kernels that
work on any layout (elementwise ops, normalization, pooling, concatenation along channels,
the optimizer's update). Shape ops (Flatten, Reshape, Transpose, ...) and matrix products are
boundaries: their rank-4 operands keep row-major storage unless a convolution reaches them
another way, so a transformer's attention tensors never change. Kernels that touch a
channels-last tensor get `"layout": "channels-last"` in their signature, so their profile
entries never mix with the row-major ones."""

from __future__ import annotations

import json
from dataclasses import replace

from autotm_py.ir.graph import Kernel, TensorGraph
from autotm_py.ir.rules.base import FLOAT_DTYPES

CHANNELS_LAST = "channels-last"
META_KEY = "layout"  # graph.meta[META_KEY] == CHANNELS_LAST on a converted graph

# kernels whose rank-4 tensors are the convolution's images (inputs, outputs, gradients)
CONVOLUTIONS = frozenset({"Conv", "ConvRelu", "ConvGrad", "ConvGradData", "ConvGradFilter"})
# kernels that compute the same values whatever the layout of their rank-4 operands, and
# whose outputs torch gives the layout of their inputs: they carry it from one to the next
LAYOUT_FREE = frozenset({
    "Relu", "ReluGrad", "LeakyRelu", "LeakyReluGrad", "Clip", "ClipGrad", "Sigmoid",
    "SigmoidGrad", "Tanh", "TanhGrad", "Add", "Sub", "Mul", "MulGrad", "Sum", "Identity",
    "GradAccumulate", "BatchNormalization", "BatchNormGrad", "MaxPool", "MaxPoolGrad",
    "AveragePool", "AveragePoolGrad", "GlobalAveragePool", "GlobalAveragePoolGrad",
    "GlobalMaxPool", "GlobalMaxPoolGrad", "Concat", "ConcatGrad", "SGDUpdate", "AdamUpdate",
    "AdamStep",
    # bf16's casts, as autocast's keep the layout: a row-major fp32 image or master weight
    # beside its channels-last bf16 copy made every cast a transposing copy, and the user's
    # channels-last batch reached its row-major slot through a pageable copy transposed on
    # the host (ResNet-200 b64 on the H200, 2026-12-04: 4.6 ms of DMA, 9 ms of host a step)
    "Cast", "CastGrad",
})


def is_channels_last(graph: TensorGraph) -> bool:
    return graph.meta.get(META_KEY) == CHANNELS_LAST


def has_convolutions(graph: TensorGraph) -> bool:
    return any(k.op_type in CONVOLUTIONS for k in graph.kernels)


def channels_last_tensors(graph: TensorGraph) -> frozenset[int]:
    """The rank-4 floating tensors joined to a convolution's images by layout-free kernels."""
    parent = {t.id: t.id for t in graph.tensors if len(t.shape) == 4 and t.dtype in FLOAT_DTYPES}

    def root(t: int) -> int:
        while parent[t] != t:
            parent[t] = parent[parent[t]]
            t = parent[t]
        return t

    seeds = []
    for k in graph.kernels:
        images = [t for t in k.io if t in parent]
        if k.op_type in CONVOLUTIONS:
            seeds.extend(images)
        if k.op_type in CONVOLUTIONS or k.op_type in LAYOUT_FREE:
            for t in images[1:]:
                parent[root(t)] = root(images[0])
    reached = {root(t) for t in seeds}
    return frozenset(t for t in parent if root(t) in reached)


def to_channels_last(graph: TensorGraph) -> TensorGraph:
    """The same graph with its convolutions' images stored channels-last. A graph without
    convolutions comes back unchanged (nothing to convert), without the meta mark."""
    if is_channels_last(graph):
        return graph
    chosen = channels_last_tensors(graph)
    if not chosen:
        return graph
    tensors = tuple(replace(t, channels_last=True) if t.id in chosen else t
                    for t in graph.tensors)
    kernels = tuple(_relabelled(k, chosen) if chosen.intersection(k.io) else k
                    for k in graph.kernels)
    return replace(graph, tensors=tensors, kernels=kernels,
                   meta={**graph.meta, META_KEY: CHANNELS_LAST})


def labelled_signature(signature: str) -> str:
    """A kernel signature (`ir.graph.kernel_signature`) with the channels-last layout in it."""
    body = json.loads(signature)
    body["layout"] = CHANNELS_LAST
    return json.dumps(body, separators=(",", ":"), sort_keys=True, default=str)


def signature_layout(signature: str) -> str | None:
    """The layout a kernel signature names, None for row-major."""
    layout = json.loads(signature).get("layout")
    return None if layout is None else str(layout)


def _relabelled(kernel: Kernel, chosen: frozenset[int]) -> Kernel:
    """The kernel with the layout in its signature (the profile's key, in the same JSON) and
    the positions of its channels-last outputs (`kernels.run_kernel` stores them so)."""
    return replace(kernel, signature=labelled_signature(kernel.signature),
                   channels_last=tuple(i for i, t in enumerate(kernel.outputs) if t in chosen))
