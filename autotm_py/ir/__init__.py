"""The tensor-graph IR (frozen), its builder, and its checks."""

from autotm_py.ir.builder import GraphBuilder, rebuild
from autotm_py.ir.graph import DTYPE_SIZES, Kernel, Role, Tensor, TensorGraph

__all__ = ["DTYPE_SIZES", "GraphBuilder", "Kernel", "Role", "Tensor", "TensorGraph", "rebuild"]
