"""autotm_py: place and move tensors across a fast and a slow memory tier with an ILP.

The public API (names are imported lazily, so `import autotm_py` stays cheap):

    graph = autotm_py.import_onnx("model.onnx", batch=32)
    graph = autotm_py.derive_training(graph, optimizer="sgd")
    costs = autotm_py.load_costs(graph, device="cuda")        # shipped or measured profiles
    result = autotm_py.optimize(graph, autotm_py.PlanConfig(ratio=parse_ratio("1:4")))
    timeline = autotm_py.simulate(graph, result.plan, costs=costs)
    run = autotm_py.execute(graph, result.plan, mode=autotm_py.RunMode(arena=True, replay=True))
"""

from __future__ import annotations

from autotm_py.exports import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "AutoTMError": "autotm_py.errors",
    "ConfigError": "autotm_py.errors",
    "PlanError": "autotm_py.errors",
    "TensorGraph": "autotm_py.ir.graph",
    "Plan": "autotm_py.plan",
    "PlanConfig": "autotm_py.config",
    "ModelOptions": "autotm_py.options",
    "RunMode": "autotm_py.options",
    "Measure": "autotm_py.options",
    "MemorySystem": "autotm_py.memory.tiers",
    "parse_ratio": "autotm_py.units",
    "import_onnx": "autotm_py.api",
    "derive_training": "autotm_py.api",
    "load_model": "autotm_py.api",
    "profile": "autotm_py.api",
    "load_costs": "autotm_py.api",
    "optimize": "autotm_py.api",
    "simulate": "autotm_py.api",
    "execute": "autotm_py.api",
    "prepare_cuda_process": "autotm_py.api",
    "Trainer": "autotm_py.trainer",
}

__all__ = [*sorted(_EXPORTS), "__version__"]


__getattr__, _ = lazy_exports(__name__, _EXPORTS, globals)
