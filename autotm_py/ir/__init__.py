"""The tensor-graph IR (frozen), its builder, and its checks.

The graph and the builder are imported here; the other public names are imported lazily (on
first use, see `_EXPORTS`).
"""

from __future__ import annotations

from autotm_py.exports import lazy_exports
from autotm_py.ir.builder import GraphBuilder, rebuild
from autotm_py.ir.graph import DTYPE_SIZES, Kernel, Role, Tensor, TensorGraph

# public name -> module that defines it (imported on first use)
_EXPORTS = {
    "has_convolutions": "autotm_py.ir.layout",
    "is_channels_last": "autotm_py.ir.layout",
    "LOSSES": "autotm_py.ir.loss",
    "Optimizer": "autotm_py.ir.optim",
    "chunkable_logits_bytes": "autotm_py.ir.training",
    "split_names": "autotm_py.ir.conv_split",
    "offloaded_updates": "autotm_py.ir.host_updates",
    "offload_updates": "autotm_py.ir.host_updates",
}

__all__ = ["DTYPE_SIZES", "GraphBuilder", "Kernel", "Role", "Tensor", "TensorGraph", "rebuild",
           *sorted(_EXPORTS)]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals)
