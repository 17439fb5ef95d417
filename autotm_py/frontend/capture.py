"""A torch module as an ONNX model whose initializers are the module's own tensors.

    captured = capture_module(model, (tokens,))
    graph = import_model(captured.model)              # frontend/onnx.py
    captured.sources["emb.weight"]                    # ("emb.weight", "head.weight")

This is the first step of training a user's module under a memory plan: the importer needs the
ONNX graph, and whoever trains it needs to know which graph weight is which parameter.

**Exporter.** torch.onnx's dynamo exporter (`dynamo=True`, onnxscript), with its optimizer
off (`optimize=False`) and a constant-folding pass of our own. Both torch exporters run on
torch 2.13, but their default outputs lose what a trainer needs:
- the TorchScript exporter (`dynamo=False`, deprecated since torch 2.9) deduplicates
  initializers *by value* in eval mode, so the LayerNorm weights of every block (all ones) and
  a BatchNorm's running_var / weight (ones) and running_mean / bias (zeros) become one
  initializer each: untied parameters would be trained as one. With constant folding on (its
  default) it also folds BatchNorm into the convolution and W^T of every Linear into new
  `onnx::MatMul_*` initializers;
- the dynamo exporter's default optimizer folds BatchNorm into Conv (rewrite rules) and keeps
  the name: its `conv.weight` initializer holds the fused filter, not the parameter. It also
  folds Transpose(W) into new `val_*` initializers and deduplicates initializers by value.
Without its optimizer, the dynamo exporter names every initializer after the parameter or
buffer it holds (torch.export lifts them under their qualified names), but leaves sequence
ops our importer rejects (`SplitToSequence`/`SequenceAt` from `torch.split`, `CastLike`,
`Range`). onnxscript's constant folding removes those; we run it with a `should_fold` that
refuses any node reading a module tensor, so no parameter is ever folded into another value.
(torch's ONNX export needs onnxscript, which the `dev` extra installs.)

**Eval mode.** The module is exported in eval mode (every submodule's `training` flag is
restored afterwards): BatchNorm exports as a plain BatchNormalization whose running mean and
variance are initializers (the training derivation trains it with batch statistics and
updates them, docs/training.md), and Dropout disappears, so the derived iteration has no
dropout. Train mode is no better: the dynamo exporter writes the same BatchNormalization
either way, and a Dropout kept in the graph (submodules left in train mode export as
`Dropout(ratio, training_mode=True)`, which the importer accepts) would be trained with one
fixed mask per kernel (docs/training.md), which is not what torch's dropout does.

**Name mapping.** An initializer is module state when its name is a name of the module's
`named_parameters(remove_duplicate=False)` or `named_buffers(remove_duplicate=False)`, and
its bytes are checked to equal that tensor's (a mismatch is an error, not a guess). Names
that refer to one tensor object are one group: a tied weight (`head.weight = emb.weight`) is
one initializer, renamed to the group's canonical name (the first in `named_parameters()`
order, the one `module.parameters()` yields) and mapped to all its names, canonical first.
Every other initializer (values the folding computed: a causal mask, an attention scale) is a
constant, and becomes a `Constant` node: the importer treats float initializers as weights,
so left as initializers they would be trained. State the graph never reads (BatchNorm's
`num_batches_tracked` in eval mode, unused parameters) has no initializer: `unused`.
Non-persistent buffers (`register_buffer(..., persistent=False)`: transformers' rotary
`inv_freq`, causal masks) are no state: they are folded as constants, and listed as `unused`.

What the importer makes of it (torch 2.13): a Linear whose weight the exporter transposes
(`MatMul(X, Transpose(W))`) imports as a weight of shape (in, out) named after the Transpose
(`frontend/weights.py` gives its values); a tied output Linear keeps the embedding's (out, in)
weight (`Linear`, transB = 1). `scaled_dot_product_attention` exports its K^T as Reshape to
(B*H, L, E), Transpose, Reshape back, which the attention fusion does not recognize, so
attention stays unfused (MatMul, Softmax, MatMul), correct but without the fused kernel's
memory savings.

Shapes are the example's: the graph is exported with static shapes, so it imports at that
batch. The export runs in memory and writes no file.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from autotm_py.errors import ModelImportError


@dataclass(frozen=True, eq=False)
class Captured:
    """A module's ONNX model and how its initializers map back to the module.

    `model`: the ONNX model, the module's tensors as initializers (named by their canonical
    module name), folded constants as Constant nodes. `sources`: initializer -> every module
    name of that tensor, canonical first (a tied weight has several). `trainable`: the
    initializers that are parameters with `requires_grad`; `frozen`: parameters without it
    (the training derivation would train them: a trainer must not apply their update);
    `buffers`: those that are buffers (BatchNorm's running statistics). `inputs`: the ONNX
    input names, in the order of the example inputs. `unused`: module names of parameters
    and buffers the graph does not read.
    """

    model: onnx.ModelProto
    sources: Mapping[str, tuple[str, ...]]
    trainable: frozenset[str]
    buffers: frozenset[str]
    inputs: tuple[str, ...]
    unused: tuple[str, ...] = ()
    frozen: frozenset[str] = frozenset()

    def module_name(self, initializer: str) -> str:
        """The canonical module name of an initializer."""
        return self.sources[initializer][0]


@dataclass(frozen=True)
class _State:
    """The module's tensors grouped by object: canonical name -> (names, tensor, is a
    parameter), and every name -> its canonical name."""

    groups: Mapping[str, tuple[tuple[str, ...], Any, bool]]
    canonical: Mapping[str, str]


def capture_module(module: Any, example_inputs: Sequence[Any], *,
                   names: Sequence[str] | None = None, values: bool = True) -> Captured:
    """Export `module` (a `torch.nn.Module`) at `example_inputs` and map its initializers
    back to its parameters and buffers.

    `names` names the ONNX inputs (default: the forward's argument names). `values=False`:
    the floating-point module tensors' initializers carry their shapes and dtypes only (each
    marked as external data under its own name, which nothing reads), checked to be the
    module's tensors themselves rather than byte by byte: for a caller that reads the values
    from the module (the Trainer), no copy of the weights is made (13 GB for a 3.33B
    decoder).

    Raises:
        ModelImportError: an initializer named after a module tensor holds other values, or
            the exported inputs do not match `example_inputs`.
    """
    state = _module_state(module)
    model = _export(module, tuple(example_inputs), names,
                    set(state.canonical) - _derived_buffers(module, state),
                    None if values else state)
    sources = _map_initializers(model, state)
    inputs = tuple(i.name for i in model.graph.input)
    if len(inputs) != len(example_inputs):
        raise ModelImportError(f"the export of {type(module).__name__} has {len(inputs)} inputs "
                               f"({', '.join(inputs)}) for {len(example_inputs)} example inputs;"
                               " give tensors only (no None or Python numbers) as inputs")
    used = {name for group in sources.values() for name in group}
    params = {n for n in sources if state.groups[n][2]}
    frozen = {n for n in params if not state.groups[n][1].requires_grad}
    return Captured(
        model=model, sources=sources, inputs=inputs, trainable=frozenset(params - frozen),
        buffers=frozenset(sources.keys() - params), frozen=frozenset(frozen),
        unused=tuple(n for n in state.canonical if n not in used))


def _module_state(module: Any) -> _State:
    """Parameters, then buffers, grouped by tensor object (tied weights are one object)."""
    groups: dict[str, tuple[tuple[str, ...], Any, bool]] = {}
    by_object: dict[int, str] = {}
    canonical: dict[str, str] = {}
    named = [(n, t, True) for n, t in module.named_parameters(remove_duplicate=False)]
    named += [(n, t, False) for n, t in module.named_buffers(remove_duplicate=False)]
    for name, tensor, is_param in named:
        first = by_object.setdefault(id(tensor), name)
        names, _, _ = groups.get(first, ((), tensor, is_param))
        groups[first] = ((*names, name), tensor, is_param)
        canonical[name] = first
    return _State(groups, canonical)


def _derived_buffers(module: Any, state: _State) -> set[str]:
    """Names of the non-persistent buffers (`register_buffer(..., persistent=False)`, left out
    of the state dict): values the module derives from its configuration, such as transformers'
    rotary `inv_freq` or a causal mask. They are constants of the graph, folded with what they
    make (rotary cos / sin), not module state: a Llama's `inv_freq` read by two kernels would
    otherwise be one tensor in two weight slots. A tensor that also has a persistent name (or
    is a parameter) stays state."""
    derived = {f"{prefix}.{b}" if prefix else b
               for prefix, m in module.named_modules(remove_duplicate=False)
               for b in getattr(m, "_non_persistent_buffers_set", ())}
    return {name for name, first in state.canonical.items()
            if not state.groups[first][2] and set(state.groups[first][0]) <= derived}


@contextlib.contextmanager
def _eval_mode(module: Any) -> Iterator[None]:
    """Every submodule in eval mode, its own flag restored afterwards (not just the root's:
    a user may have frozen some submodules in eval mode)."""
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, flag in flags:
            m.training = flag


def _export(module: Any, args: tuple[Any, ...], names: Sequence[str] | None,
            state: set[str], without_values: _State | None = None) -> onnx.ModelProto:
    """The dynamo export without its optimizer, our folding, folded values as Constants;
    `without_values`: the module's floating-point tensors left out (`_values_left_out`)."""
    import torch
    from onnxscript import optimizer

    with _eval_mode(module), warnings.catch_warnings():
        # the exporter warns about pytree internals of torch itself, nothing the user can fix
        warnings.simplefilter("ignore", FutureWarning)
        # nn.LSTM/GRU re-assign their `_flat_weights` list while torch.export swaps the
        # parameters; torch calls that an unregistered tensor attribute
        warnings.filterwarnings("ignore", r"The tensor attributes .*_flat_weights",
                                UserWarning)
        program = torch.onnx.export(module, args, dynamo=True, optimize=False,
                                    input_names=list(names) if names else None, verbose=False)
    assert program is not None  # no file given: the exporter returns the program

    def should_fold(node: Any) -> bool | None:
        # False: never fold a node that reads a module tensor (a Transpose of a weight would
        # become a new initializer); None: onnxscript's own rules decide
        reads_state = any(v is not None and v.name in state for v in node.inputs)
        return False if reads_state else None

    # onnxscript folds through onnx's reference evaluator (NumPy): IEEE values without its
    # RuntimeWarnings, as `fold_eval.evaluate` folds (T5's buckets take log(0) and discard it)
    with np.errstate(all="ignore"):
        optimizer.fold_constants(program.model, should_fold=should_fold)
    optimizer.remove_unused_nodes(program.model)
    if without_values is not None:
        _values_left_out(program.model, without_values)
    model = program.model_proto
    _constants_as_nodes(model, state)
    return model


def _values_left_out(model: Any, state: _State) -> None:
    """Replace the value of each floating-point module tensor's initializer of the exporter's
    model (onnx_ir) by a reference to external data named after it, once checked to be the
    module's tensor itself (torch.export lifts each parameter and buffer as it is: a value
    computed from one would be a bug, as `_check_bytes` says); no bytes are serialized."""
    from onnxscript import ir

    for name, value in model.graph.initializers.items():
        tensor = state.groups[state.canonical[name]][1] if name in state.canonical else None
        if tensor is None or not tensor.is_floating_point():
            continue
        held = getattr(value.const_value, "raw", None)
        if not _same_tensor(held, tensor):
            raise ModelImportError(
                f"the exported initializer '{name}' is not the module's tensor of that name: "
                "the exporter transformed it; this is a bug of autotm's capture, please report "
                "it")
        value.const_value = ir.ExternalTensor(
            f"{name}{LEFT_OUT_SUFFIX}", 0, tensor.numel() * tensor.element_size(),
            value.const_value.dtype, shape=value.const_value.shape, name=name)


# the external-data location of a value `capture_module(values=False)` left out: no such file
LEFT_OUT_SUFFIX = ".in-module"


def _same_tensor(held: Any, tensor: Any) -> bool:
    """Whether the exporter's initializer holds `tensor`'s own elements (the same memory,
    shape, strides and dtype)."""
    import torch

    return isinstance(held, torch.Tensor) and held.dtype == tensor.dtype and \
        held.shape == tensor.shape and held.stride() == tensor.stride() and \
        held.data_ptr() == tensor.data_ptr()


def _constants_as_nodes(model: onnx.ModelProto, state: set[str]) -> None:
    """Turn every initializer that is not a module tensor into a Constant node, placed first
    (the importer reads float initializers as weights, which training would update)."""
    inits = model.graph.initializer
    at = [i for i, init in enumerate(inits) if init.name not in state]
    if not at:
        return
    constants = [helper.make_node("Constant", [], [inits[i].name],
                                  name=f"{inits[i].name}_constant", value=inits[i]) for i in at]
    # deleted where they are: re-adding the module's initializers would copy every weight's
    # bytes (a third of a 0.3B decoder's capture time, 4.6 of 12 s, 2026-12-05)
    for i in reversed(at):
        del inits[i]
    nodes = [*constants, *model.graph.node]
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _map_initializers(model: onnx.ModelProto, state: _State) -> dict[str, tuple[str, ...]]:
    """Rename each initializer to its canonical module name, check its bytes, and return
    initializer -> module names."""
    sources: dict[str, tuple[str, ...]] = {}
    renames: dict[str, str] = {}
    for init in model.graph.initializer:
        first = state.canonical[init.name]  # only module tensors are left as initializers
        names, tensor, _ = state.groups[first]
        if init.data_location != onnx.TensorProto.EXTERNAL:  # else `_values_left_out` checked
            _check_bytes(init, tensor, init.name)
        if init.name != first:
            renames[init.name] = first
            init.name = first
        sources[first] = names
    _rename(model, renames)
    return sources


def _check_bytes(init: onnx.TensorProto, tensor: Any, name: str) -> None:
    """The initializer holds exactly the module tensor's bytes (the exporter copied it, it
    did not compute it)."""
    import torch

    value = tensor.detach().cpu().contiguous()
    # compared as byte views, not copies: a 3B-parameter module has 13 GB of them
    ours = value.reshape(-1).view(torch.uint8).numpy() if value.numel() else np.empty(0, np.uint8)
    theirs = np.frombuffer(init.raw_data, np.uint8) if init.raw_data else \
        np.ascontiguousarray(numpy_helper.to_array(init)).reshape(-1).view(np.uint8)
    if tuple(init.dims) != tuple(value.shape) or not np.array_equal(ours, theirs):
        raise ModelImportError(
            f"the exported initializer '{name}' is not the module's tensor of that name (shape "
            f"{tuple(init.dims)} against {tuple(value.shape)}, or other values): the exporter "
            "transformed it; this is a bug of autotm's capture, please report it")


def _rename(model: onnx.ModelProto, renames: Mapping[str, str]) -> None:
    """Rename tensors in every node input and graph output (initializers are renamed)."""
    if not renames:
        return
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
    for out in model.graph.output:
        if out.name in renames:
            out.name = renames[out.name]
