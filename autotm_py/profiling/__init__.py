"""Kernel costs: the profile cache, the torch profiler, and the roofline estimate."""

from autotm_py.profiling.costs import KernelCosts

__all__ = ["KernelCosts"]
