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
    """An operator that the importer (or the training derivation) does not support.

    `op_type`, `domain` and `node` name the first one; `others` lists every unsupported
    (op_type, domain, node count, first node) of the model, the first included, so that one
    message names them all with their counts."""

    def __init__(
        self,
        op_type: str,
        *,
        domain: str = "",
        opset: int | None = None,
        node: str = "",
        supported: tuple[str, ...] = (),
        what: str = "the ONNX importer",
        others: tuple[tuple[str, str, int, str], ...] = (),
    ) -> None:
        self.op_type = op_type
        self.domain = domain
        self.opset = opset
        self.node = node
        self.supported = supported
        self.others = others or ((op_type, domain, 1, node),)
        ops = f"; supported: {', '.join(sorted(supported))}" if supported else ""
        opset_txt = f" opset {opset}" if opset is not None else ""
        if len(self.others) == 1 and self.others[0][2] == 1:
            where = f" (node {node!r})" if node else ""
            super().__init__(f"op {op_type!r} of domain {domain or 'ai.onnx'!r}{opset_txt}{where} "
                             f"is not supported by {what}{ops}")
            return
        nodes = sum(n for _, _, n, _ in self.others)
        kinds = ", ".join(_kind(*other) for other in self.others)
        super().__init__(f"{nodes} nodes of {len(self.others)} op types{opset_txt} are not "
                         f"supported by {what}: {kinds}{ops}")


def _kind(op_type: str, domain: str, count: int, node: str) -> str:
    """"'FusedGemm' of domain 'com.microsoft' x2 (e.g. node 'gemm_1')"."""
    dom = f" of domain {domain!r}" if domain else ""
    where = f" (e.g. node {node!r})" if node and count > 1 else f" (node {node!r})" if node else ""
    return f"{op_type!r}{dom} x{count}{where}"


def unsupported_summary(found: list[tuple[str, str, str]]) -> tuple[tuple[str, str, int, str], ...]:
    """[(op_type, domain, node), ...] in model order -> ((op_type, domain, count, first node),
    ...) in order of first appearance."""
    counts: dict[tuple[str, str], list] = {}
    for op_type, domain, node in found:
        counts.setdefault((op_type, domain), [0, node])[0] += 1
    return tuple((op, dom, n, first) for (op, dom), (n, first) in counts.items())


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
EXTRAS = {"torch": "torch", "highspy": "highs", "juliacall": "julia", "ray": "ray"}


class MissingDependencyError(AutoTMError):
    """A module that is not installed; the message names the pip command that installs it."""

    def __init__(self, module: str, needed_by: str = "this") -> None:
        self.module = module
        extra = EXTRAS.get(module)
        fix = f'pip install "autotm_py[{extra}]"' if extra else \
            f"pip install {module} (a dependency of autotm_py; reinstall it)"
        super().__init__(f"{needed_by} needs {module}, which is not installed: {fix}")
