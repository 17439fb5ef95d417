"""Frontends: ONNX import (`onnx`) and the model zoo (`zoo`), into a `TensorGraph`.

The public names are imported lazily (on first use), so importing a submodule does not import
the others (onnx, torch); other layers import these names from here, not from the submodules.
"""

from __future__ import annotations

from autotm_py.exports import lazy_exports

# public name -> module that defines it
_EXPORTS = {
    "import_onnx": "autotm_py.frontend.onnx",
    "ZOO": "autotm_py.frontend.zoo",
    "build_graph": "autotm_py.frontend.zoo",
    "build_model": "autotm_py.frontend.zoo",
    "count_params": "autotm_py.frontend.zoo",
    "export_model": "autotm_py.frontend.zoo",
    "resolve_dims": "autotm_py.frontend.zoo",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals)
