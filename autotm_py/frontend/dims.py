"""Binding the symbolic dimensions of a model's inputs to numbers.

Sources, lowest priority first: the model's own defaults (metadata `autotm.default_dims`),
`--dim NAME=VALUE`, and `--batch N`, which sets the first dimension of every graph input
whether it is symbolic or a fixed number (a fixed batch baked into the file can be changed;
if the graph hard-codes it elsewhere, shape inference then fails with a clear error).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import onnx

from autotm_py.errors import ConfigError, ModelImportError, ShapeError

Dim = int | str | None  # a number, a symbolic name, or unknown


@dataclass(frozen=True)
class Binding:
    """The static shape of every graph input and how each symbolic name was bound."""

    shapes: Mapping[str, tuple[int, ...]]
    dims: Mapping[str, int]
    rebatched: tuple[str, ...]  # inputs whose fixed first dim --batch changed


def declared_dims(value: onnx.ValueInfoProto, source: str) -> tuple[Dim, ...]:
    """The input's dims as declared in the file; non-tensor inputs are an error."""
    if value.type.WhichOneof("value") != "tensor_type":
        raise ModelImportError(f"graph input '{value.name}' of model '{source}' is not a tensor "
                               f"({value.type.WhichOneof('value')}); only tensor inputs import")
    ttype = value.type.tensor_type
    if not ttype.HasField("shape"):
        raise ShapeError(f"graph input '{value.name}' of model '{source}' has no shape (not even "
                         "a rank); re-export the model with input shapes")
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                 for d in ttype.shape.dim)


def bind_inputs(inputs: Mapping[str, onnx.ValueInfoProto], *, source: str,
                batch: int | None = None, dims: Mapping[str, int] | None = None,
                defaults: Mapping[str, int] | None = None) -> Binding:
    """Static input shapes from `--batch`, `--dim` and the model's defaults, or a clear error."""
    declared = {name: declared_dims(v, source) for name, v in inputs.items()}
    names = {d for shape in declared.values() for d in shape if isinstance(d, str)}
    _check_user_dims(dims or {}, names, source)
    bound = {k: v for k, v in (defaults or {}).items() if k in names}
    bound.update(dims or {})
    if batch is not None:
        _bind_batch_names(declared, batch, dims or {}, bound)
    shapes: dict[str, tuple[int, ...]] = {}
    rebatched = []
    for name, shape in declared.items():
        if batch is not None and shape and isinstance(shape[0], int) and shape[0] != batch:
            rebatched.append(name)
        shapes[name] = _resolve(name, shape, bound, batch, source)
    return Binding(shapes, {k: bound[k] for k in sorted(bound)}, tuple(rebatched))


def _check_user_dims(dims: Mapping[str, int], names: set[str], source: str) -> None:
    for name, value in dims.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"--dim {name}={value}: the value must be a positive integer")
        if name not in names:
            known = ", ".join(sorted(names)) or "none (every input dim is fixed)"
            raise ConfigError(f"--dim {name}={value}: model '{source}' has no symbolic input "
                              f"dimension named {name!r}; its symbolic dims are: {known}")


def _bind_batch_names(declared: Mapping[str, tuple[Dim, ...]], batch: int,
                      dims: Mapping[str, int], bound: dict[str, int]) -> None:
    """A symbolic first dim takes the batch everywhere it appears (so inputs stay consistent)."""
    if batch <= 0:
        raise ConfigError(f"--batch {batch}: must be a positive integer")
    for shape in declared.values():
        if shape and isinstance(shape[0], str):
            name = shape[0]
            if name in dims and dims[name] != batch:
                raise ConfigError(f"--batch {batch} and --dim {name}={dims[name]} disagree: "
                                  f"{name!r} is the first dimension of an input; give only one")
            bound[name] = batch


def _resolve(name: str, shape: tuple[Dim, ...], bound: Mapping[str, int], batch: int | None,
             source: str) -> tuple[int, ...]:
    out = []
    for axis, dim in enumerate(shape):
        if axis == 0 and batch is not None:
            out.append(batch)
        elif isinstance(dim, int):
            out.append(dim)
        elif isinstance(dim, str) and dim in bound:
            out.append(bound[dim])
        elif isinstance(dim, str):
            hint = " or --batch N" if axis == 0 else ""
            raise ShapeError(f"input '{name}' of model '{source}' has unbound symbolic dimension "
                             f"{dim!r} (axis {axis}); bind it with --dim {dim}=VALUE{hint}")
        else:
            hint = "--batch N" if axis == 0 else "a re-export with fixed or named dims"
            raise ShapeError(f"input '{name}' of model '{source}' has an unknown, unnamed "
                             f"dimension at axis {axis}; fix it with {hint}")
    return tuple(out)
