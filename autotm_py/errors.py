"""The exception tree of autotm_py.

Misuse and bad input raise an `AutoTMError` subclass whose message is one line that names the
input and the fix; the CLI prints it as ``error: <message>`` and exits non-zero. An infeasible
memory budget is *not* an exception: planning returns a result whose status says so.
"""

from __future__ import annotations


class AutoTMError(Exception):
    """Base class of every error this package raises on purpose."""

    exit_code = 1


class ModelImportError(AutoTMError):
    """The model file cannot be read or is not a model we can import."""


class UnsupportedOpError(ModelImportError):
    """An operator that the importer (or the training derivation) does not support."""

    def __init__(
        self,
        op_type: str,
        *,
        domain: str = "",
        opset: int | None = None,
        node: str = "",
        supported: tuple[str, ...] = (),
        what: str = "the ONNX importer",
    ) -> None:
        self.op_type = op_type
        self.domain = domain
        self.opset = opset
        self.node = node
        self.supported = supported
        where = f" (node {node!r})" if node else ""
        dom = domain or "ai.onnx"
        ops = f"; supported: {', '.join(sorted(supported))}" if supported else ""
        opset_txt = f" opset {opset}" if opset is not None else ""
        super().__init__(
            f"op {op_type!r} of domain {dom!r}{opset_txt}{where} is not supported by {what}"
            f"{ops}"
        )


class ShapeError(ModelImportError):
    """A shape that is unknown, symbolic and unbound, or inconsistent."""


class GraphError(AutoTMError):
    """A tensor graph that breaks an invariant (see `TensorGraph.validate`)."""


class ProfileError(AutoTMError):
    """A profile cache that is corrupt, or a kernel that cannot be profiled."""


class ConfigError(AutoTMError):
    """A bad option: ratio, budget, memory-system file, solver name, device..."""

    exit_code = 2


class SolverError(AutoTMError):
    """The solver is missing, crashed, or returned something unusable."""


class PlanError(AutoTMError):
    """A plan that does not belong to the graph, is malformed, or breaks a memory rule."""


class ExecutionError(AutoTMError):
    """A plan failed while it was executed for real."""


# Optional dependencies and the extra of autotm_py that installs each (pyproject.toml).
# Modules not listed are core dependencies: `pip install autotm_py` brings them.
EXTRAS = {"torch": "torch", "highspy": "highs", "juliacall": "julia"}


class MissingDependencyError(AutoTMError):
    """A module that is not installed; the message names the pip command that installs it."""

    def __init__(self, module: str, needed_by: str = "this") -> None:
        self.module = module
        extra = EXTRAS.get(module)
        fix = f'pip install "autotm_py[{extra}]"' if extra else \
            f"pip install {module} (a dependency of autotm_py; reinstall it)"
        super().__init__(f"{needed_by} needs {module}, which is not installed: {fix}")
