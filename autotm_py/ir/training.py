"""Training derivation: one iteration = forward + loss + backward + optimizer update.

`derive_training(graph)` takes a forward graph in the importer's canonical form and returns a
new `TensorGraph` with, in execution order:

1. the forward kernels, same ids and order; ops that behave differently in training are
   rewritten by their rule's `prepare` (BatchNormalization uses batch statistics and saves
   them, LayerNormalization saves Mean/InvStdDev, Dropout saves a seeded mask);
2. the loss: the graph's own SoftmaxCrossEntropyLoss if it has one, else the loss that
   `loss` picks for the first float output (`ir/loss.py`: softmax cross-entropy over the class
   axis its shape implies, or mean squared error) against a new LABEL tensor; with
   `loss_chunks` > 1, a softmax cross-entropy over the last axis of a language-model head's
   output (`ir/heads.py`: a fused `Linear`, a `Gemm`, a `MatMul` by a 2-d weight) replaces
   that head by one `LinearCrossEntropy` kernel, at its place, that works through the rows in
   that many blocks and never holds the whole logits (`ir/rules/fused.py`; the logits
   tensor's id becomes the loss's; meta["training"]["head"] says which head it was, also
   where the plain loss could be chunked). Under bf16 autocast (`ir.precision`) the plain
   softmax cross-entropy reads the head's bf16 output behind the fp32 Cast, which it drops
   (`_cross_entropy`: fp32 loss and log-probabilities, a bf16 gradient). A softmax
   cross-entropy on the output of a final Softmax or LogSoftmax (directly or through
   Reshape/Transpose...) drops that kernel and trains on its input, the logits
   (`_train_on_logits`, recorded in meta["training"]["dropped_output"]); where it cannot, a
   Softmax is refused (cross-entropy on probabilities);
3. backward kernels in reverse forward order (ops of domain "autotm", see `TRAINING_OPS`),
   with partial gradients of tensors that have several users summed by `GradAccumulate` as
   soon as the next partial arrives (as nGraph's and PyTorch's autodiff do);
4. one optimizer update per trained weight (`SGDUpdate`, or `AdamStep` then `AdamUpdate`),
   for `optimizer` "sgd", "adam" or an `ir.optim.Optimizer` (momentum, Nesterov, weight decay,
   AdamW, a learning rate given as a tensor each iteration: `ir/optim.py`).

Only gradients that reach a trainable weight are computed: weights are float WEIGHT tensors
without a producer; INPUT, LABEL, CONSTANT and integer tensors get none. `carried` pairs each
weight, optimizer state tensor (Adam's moments, SGD's momentum buffers), BatchNorm running
statistic and the Adam step with its next value;
the graph outputs are the loss and those next values. Runs in O(kernels).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotm_py.errors import ConfigError, GraphError, UnsupportedOpError, unsupported_summary
from autotm_py.ir.builder import GraphBuilder
from autotm_py.ir.dtypes import DTYPE_SIZES
from autotm_py.ir.graph import Role, TensorGraph
from autotm_py.ir.heads import LOW_FLOATS, Head, find_head, up_cast
from autotm_py.ir.layout import is_channels_last
from autotm_py.ir.loss import (
    LOSSES,
    FinalSoftmax,
    LossChoice,
    choose_loss,
    final_softmax,
    probabilities_refusal,
)
from autotm_py.ir.optim import OPTIMIZERS, Optimizer, optimizer_updates, resolve
from autotm_py.ir.rules import RULES, TRAINING_OPS, KernelDraft, Tape, TensorDraft
from autotm_py.ir.rules.base import BACKWARD_DOMAIN, FLOAT_DTYPES
from autotm_py.ir.rules.fused import (
    LINEAR_CE,
    linear_ce_classes,
    linear_ce_padding,
    linear_ce_workspace,
    lse_dtype,
)

ADAM_DEFAULTS = {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}

__all__ = ["ADAM_DEFAULTS", "LOSSES", "OPTIMIZERS", "RULES", "TRAINING_OPS", "Optimizer",
           "derive_training"]


def derive_training(graph: TensorGraph, *, optimizer: str | Optimizer = "sgd",
                    learning_rate: float | None = None, loss: str = "auto",
                    loss_chunks: int = 1) -> TensorGraph:
    """The training iteration of a forward graph (see the module docstring). `optimizer`:
    "sgd" or "adam" with `learning_rate` (default 0.01), or an `ir.optim.Optimizer` that holds
    its learning rate (`learning_rate` then unset)."""
    opt = _check_arguments(graph, optimizer, learning_rate)
    if loss not in LOSSES:
        raise ConfigError(f"loss {loss!r} is not supported; use one of {', '.join(LOSSES)}")
    check_loss_chunks(loss_chunks)
    tape = _forward_drafts(graph)
    for k in tape.kernels:
        prepare = RULES[k.op_type].prepare
        if prepare is not None:
            prepare(tape, k)
    loss_kernel, labels, dropped, head = _attach_loss(graph, tape, loss, loss_chunks)
    n_forward = len(tape.kernels)
    flow = _gradient_flow(tape, loss_kernel)
    tape.expected.update(flow.expected)
    weight_grads = _backward(tape, flow, loss_kernel)
    lr_tensor = optimizer_updates(tape, weight_grads, opt)
    loss_rule, loss = loss, tape.kernels[loss_kernel].outputs[0]
    opt_meta = opt.meta()
    meta = {
        "optimizer": opt_meta.pop("optimizer"), "learning_rate": opt_meta.pop("learning_rate"),
        "loss": loss, "labels": labels, "loss_kernel": loss_kernel, "loss_rule": loss_rule,
        **({"loss_chunks": loss_chunks} if loss_chunks > 1 else {}),
        # the final Softmax/LogSoftmax the loss trains through ({"op", "name", "logits"}),
        # for the faces to say so
        **({"dropped_output": dropped} if dropped is not None else {}),
        # the language-model head the loss reads, where it can be chunked (`ir/heads.py`)
        **({"head": head} if head is not None else {}),
        "forward_kernels": n_forward, "weight_grads": tuple(sorted(weight_grads.items())),
        **opt_meta,  # Adam's beta1, beta2, epsilon; the hyper-parameters that are set
        **({"lr_tensor": lr_tensor} if lr_tensor is not None else {}),
    }
    return _freeze(graph, tape, n_forward, [loss, *(new for _, new in tape.carried)], meta)


# ---- checks and set-up ----------------------------------------------------------------------
def _check_arguments(graph: TensorGraph, optimizer: str | Optimizer,
                     learning_rate: float | None) -> Optimizer:
    opt = resolve(optimizer, learning_rate)
    if "training" in graph.meta:
        raise GraphError(f"graph {graph.name!r} is already a training graph; derive training "
                         "from the forward graph")
    if is_channels_last(graph):
        raise GraphError(f"graph {graph.name!r} is stored channels-last; derive training from "
                         "the row-major graph, then convert (`ir.layout.to_channels_last`)")
    bad = [k for k in graph.kernels
           if k.op_type not in RULES or k.domain not in ("", BACKWARD_DOMAIN)]
    if bad:
        raise UnsupportedOpError(
            bad[0].op_type, domain=bad[0].domain, node=bad[0].name, supported=tuple(RULES),
            what="the training derivation (--training)",
            others=unsupported_summary([(k.op_type, k.domain, k.name) for k in bad]))
    return opt


def _forward_drafts(graph: TensorGraph) -> Tape:
    """Drafts of the forward tensors and kernels; forward outputs become activations."""
    tensors = [TensorDraft(t.name, t.shape, t.dtype,
                           Role.ACTIVATION if t.role == Role.OUTPUT else t.role)
               for t in graph.tensors]
    kernels = [KernelDraft(k.name, k.op_type, k.domain, k.attrs_dict, list(k.inputs),
                           list(k.outputs), k.workspace_bytes) for k in graph.kernels]
    return Tape(tensors, kernels)


def check_loss_chunks(chunks: object) -> None:
    """`--loss-chunks` is a positive integer (1: the plain loss)."""
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ConfigError(f"--loss-chunks {chunks!r}: expected a positive integer (1 keeps the "
                          "plain loss; e.g. 16 splits a language model's loss into 16 blocks)")


def _attach_loss(graph: TensorGraph, tape: Tape, choice: str = "auto", chunks: int = 1
                 ) -> tuple[int, int, dict[str, str] | None, dict[str, Any] | None]:
    """(loss kernel id, labels tensor id, the dropped final softmax or None, the chunkable
    head or None): the graph's own loss, or the one `choice` picks."""
    for kid in range(len(tape.kernels) - 1, -1, -1):
        k = tape.kernels[kid]
        if k.op_type == "SoftmaxCrossEntropyLoss":
            tape.tensors[k.outputs[0]].role = Role.OUTPUT
            if tape.tensors[k.inputs[1]].role == Role.INPUT:
                tape.tensors[k.inputs[1]].role = Role.LABEL
            if choice != "auto":
                raise ConfigError(f"graph {graph.name!r} has its own loss ({k.name!r}); "
                                  f"--loss {choice} applies only to graphs without one")
            if chunks > 1:
                raise ConfigError(f"graph {graph.name!r} has its own loss ({k.name!r}); "
                                  f"--loss-chunks {chunks} applies only to the loss the "
                                  "training derivation adds; use --loss-chunks 1")
            return kid, k.inputs[1], None, None
    out = next((t for t in graph.outputs if tape.dtype(t) in FLOAT_DTYPES), None)
    if out is None:  # a scalar is fine for mse; choose_loss refuses it for cross-entropy
        raise GraphError(f"graph {graph.name!r} has no float output to put a loss on; add one, "
                         "or a SoftmaxCrossEntropyLoss")
    shape, dtype = tape.shape(out), tape.dtype(out)
    producer = graph.tensors[out].producer
    spec = choose_loss(choice, tape.name(out), shape, dtype,
                       None if producer is None else graph.kernels[producer].op_type)
    logits, dropped = _train_on_logits(graph, tape, out, spec, choice)
    name = "labels" if spec.labels_dtype == "int64" else "targets"
    labels = tape.new_tensor(name, spec.labels_shape, spec.labels_dtype, Role.LABEL)
    head = _loss_head(tape, logits, spec)
    if chunks > 1:
        kid = _chunked_loss(tape, logits, labels, head, chunks)
        return kid, labels, dropped, head.meta() if isinstance(head, Head) else None
    if spec.op_type != "SoftmaxCrossEntropy":
        loss = tape.new_tensor("loss", (), dtype, Role.OUTPUT)
        tape.kernels.append(KernelDraft("loss", spec.op_type, BACKWARD_DOMAIN,
                                        dict(spec.attrs), [logits, labels], [loss]))
    else:
        _cross_entropy(tape, logits, labels, spec)
    return len(tape.kernels) - 1, labels, dropped, \
        None if isinstance(head, str) else head.meta()


def _cross_entropy(tape: Tape, logits: int, labels: int, spec: LossChoice) -> None:
    """Append the unchunked softmax cross-entropy on `logits`: loss and log-probabilities in
    float32 for bf16 or fp16 logits (`kernels.util.loss_dtype`), else in theirs. Under bf16
    autocast (`ir.precision`) the logits are a Cast up of the head's bf16 output, read by the
    loss alone: that Cast is dropped and the loss reads the bf16 tensor, computing in fp32
    inside its kernel (torch's upcast copy is its workspace); the fp32 tensor becomes the
    log-probabilities, and the gradient is written in bf16 (no Cast before or after it)."""
    low = _half_logits(tape, logits)
    read = tape.dtype(logits if low is None else low)
    dtype = "float32" if read in LOW_FLOATS else read
    loss = tape.new_tensor("loss", (), dtype, Role.OUTPUT)
    if low is None:
        log_prob = tape.new_tensor(f"{tape.name(logits)}::log_prob", tape.shape(logits), dtype,
                                   Role.ACTIVATION)
    else:  # the fp32 copy's tensor (float32 already) holds the log-probabilities
        tape.rename(logits, f"{tape.name(logits)}::log_prob")
        log_prob, logits = logits, low
    upcast = 0 if dtype == read else math.prod(tape.shape(logits)) * DTYPE_SIZES[dtype]
    tape.kernels.append(KernelDraft("loss", spec.op_type, BACKWARD_DOMAIN, dict(spec.attrs),
                                    [logits, labels], [loss, log_prob], upcast))


def _half_logits(tape: Tape, logits: int) -> int | None:
    """The bf16 (or fp16) tensor that `logits` is a Cast up to float32 of, the Cast dropped,
    where nothing but the loss reads either (the Cast `ir.precision` puts after a head whose
    output is the graph's); else None, the tape unchanged."""
    made = next((i for i, d in enumerate(tape.kernels) if logits in d.outputs), None)
    if made is None or not up_cast(tape.kernels[made], tape.tensors):
        return None
    low = tape.kernels[made].inputs[0]
    if any(low in d.inputs or logits in d.inputs
           for i, d in enumerate(tape.kernels) if i != made):
        return None
    del tape.kernels[made]
    return low


def _train_on_logits(graph: TensorGraph, tape: Tape, out: int, spec: LossChoice,
                     choice: str) -> tuple[int, dict[str, str] | None]:
    """(the tensor the loss reads, what was dropped). A softmax cross-entropy on output `out`
    made by a final Softmax/LogSoftmax (through ops that only move elements,
    `ir/loss.final_softmax`) whose rows are the loss's: drop that kernel and let its reader
    (or the loss) read its input; the output then holds the logits, in the same shape. Exact:
    cross-entropy on logits is what the model's softmax means, and LogSoftmax's input has the
    same softmax. A Softmax that cannot be dropped is refused (cross-entropy on probabilities:
    losses near ln(C), vanishing gradients); a LogSoftmax stays (on log-probabilities,
    cross-entropy is an NLL)."""
    found = final_softmax(graph, out) if spec.op_type == "SoftmaxCrossEntropy" else None
    if found is None:
        return out, None
    shape, axis = tape.shape(out), int(spec.attrs["axis"])
    if not (found.private and found.out_axis == axis % len(shape)):
        if found.op_type == "LogSoftmax":
            return out, None
        raise ConfigError(probabilities_refusal(choice, tape.name(out), shape, found, graph,
                                                axis, _loss_on_axis(graph, out, found, choice)))
    # forward ids before the softmax stay; the kernels after it (its chain, usually nothing
    # else) move down by one
    reader = found.chain[0] if found.chain else None
    if reader is not None:
        k = tape.kernels[reader]
        k.inputs = [found.logits if t == found.probs else t for t in k.inputs]
    del tape.kernels[found.kernel]
    dropped = {"op": found.op_type, "name": found.name, "logits": tape.name(found.logits)}
    return (out if reader is not None else found.logits), dropped


def _loss_on_axis(graph: TensorGraph, out: int, found: FinalSoftmax, choice: str) -> str | None:
    """The --loss, other than `choice`, whose class axis has the softmax's rows, if any."""
    t = graph.tensors[out]
    producer = None if t.producer is None else graph.kernels[t.producer].op_type
    for other in ("ce-axis1", "ce-last"):
        if other == choice:
            continue
        try:
            spec = choose_loss(other, t.name, t.shape, t.dtype, producer)
        except ConfigError:
            continue
        if found.out_axis == int(spec.attrs["axis"]) % len(t.shape):
            return other
    return None


def _loss_head(tape: Tape, logits: int, spec: LossChoice) -> Head | str:
    """The head whose loss `--loss-chunks` can compute in blocks (`ir/heads.py`: a Linear, a
    Gemm, a MatMul by a weight), or why not: the loss must be a softmax cross-entropy over the
    last axis of its output, read by nothing else. Before the loss kernel is appended."""
    last = len(tape.shape(logits)) - 1
    if spec.op_type != "SoftmaxCrossEntropy" or int(spec.attrs["axis"]) % (last + 1) != last:
        return "the loss is not a softmax cross-entropy over the output's last axis"
    head = find_head(tape.kernels, tape.tensors, logits)
    # the tape's readers, not the graph's users: a dropped final softmax reads it no more
    if not isinstance(head, str) and any(logits in k.inputs for k in tape.kernels):
        return "other kernels read the output"
    return head


def _chunked_loss(tape: Tape, logits: int, labels: int, head: Head | str, chunks: int) -> int:
    """Replace the head that makes `logits` by a LinearCrossEntropy kernel at its place (the
    logits tensor becomes the loss); its id. Refused, in one line that names what makes the
    output, where that is no head (`_loss_head`)."""
    if isinstance(head, str):
        raise ConfigError(f"--loss-chunks {chunks}: cannot chunk the loss on output "
                          f"{tape.name(logits)!r} ({head}); chunking applies to language-model "
                          "heads (a Linear layer, a Gemm or a MatMul by a 2-d weight, then "
                          "cross-entropy over the vocabulary: docs/training.md); use "
                          "--loss-chunks 1")
    # from the tape, not the graph: a dropped final softmax moved the kernels after it
    producer = next(i for i, d in enumerate(tape.kernels) if logits in d.outputs)
    if head.low is not None:  # bf16: the head's kernel replaced, the Cast up after it dropped
        del tape.kernels[producer]
        producer = next(i for i, d in enumerate(tape.kernels) if head.low in d.outputs)
    out = tape.tensors[logits]
    tape.rename(logits, "loss")
    out.shape, out.role = (), Role.OUTPUT
    x_shape = tape.shape(head.x)
    lse = tape.new_tensor(f"{out.name}::logsumexp", x_shape[:-1], lse_dtype(out.dtype),
                          Role.ACTIVATION)
    inputs = [head.x, head.w, *(() if head.bias is None else (head.bias,))]
    tape.kernels[producer] = KernelDraft(
        f"{tape.kernels[producer].name}+loss", LINEAR_CE, BACKWARD_DOMAIN,
        {"transB": head.trans_b, "chunks": chunks}, [*inputs, labels], [logits, lse],
        _chunk_workspace(tape, head, x_shape, chunks, out.dtype))
    return producer


def _chunk_workspace(tape: Tape, head: Head, x_shape: tuple[int, ...], chunks: int,
                     dtype: str) -> int:
    """One block's logits in `dtype`; in bf16 (`head.low`) that block and its fp32 copy; the
    weight padded to aligned classes where a GPU pads it."""
    classes = linear_ce_classes(tape.shape(head.w), head.trans_b)
    own = linear_ce_workspace(x_shape, classes, chunks, dtype)
    own += linear_ce_padding(x_shape[-1], classes, tape.dtype(head.x))
    if head.low is None:
        return own
    return own + linear_ce_workspace(x_shape, classes, chunks, tape.dtype(head.low))


def chunkable_logits_bytes(graph: TensorGraph, kid: int) -> int | None:
    """The bytes of a training graph's logits where its plain loss could be chunked (the
    derivation found a head, `meta["training"]["head"]`: a softmax cross-entropy over the last
    axis of a Linear's, a Gemm's or a MatMul-by-a-weight's output, read by the loss alone) and
    kernel `kid` holds a tensor of their shape (the logits, their log-probabilities, their
    gradient); else None. Where such a kernel sets the smallest budget, `--loss-chunks` lowers
    it."""
    meta = graph.meta.get("training") or {}
    if "head" not in meta or int(meta.get("loss_chunks", 1)) > 1:
        return None
    logits = graph.tensors[graph.kernels[int(meta["loss_kernel"])].inputs[0]]
    held = (*graph.kernels[kid].inputs, *graph.kernels[kid].outputs)
    if not any(graph.tensors[t].shape == logits.shape for t in held):
        return None
    return logits.nbytes


# ---- which tensors get gradients ----------------------------------------------------------
@dataclass(frozen=True)
class _Flow:
    has_grad: list[bool]  # the tensor gets a gradient
    active: list[bool]  # the forward kernel gets a backward
    expected: dict[int, int]  # partial gradients each tensor receives


def _float_slots(tape: Tape, tids: list[int], slots: range | tuple[int, ...]) -> list[int]:
    return [tids[i] for i in slots if i < len(tids) and tape.dtype(tids[i]) in FLOAT_DTYPES]


def _gradient_flow(tape: Tape, loss_kernel: int) -> _Flow:
    """Forward: which tensors depend on a trainable weight. Backward: which the loss reads."""
    n = loss_kernel + 1
    need = [t.role == Role.WEIGHT and t.dtype in FLOAT_DTYPES for t in tape.tensors]
    blocked: dict[int, KernelDraft] = {}  # float outputs the rule cannot differentiate
    for k in tape.kernels[:n]:
        rule = RULES[k.op_type]
        if any(need[t] for t in _float_slots(tape, k.inputs, rule.diff_inputs(k))):
            diff = _float_slots(tape, k.outputs, rule.diff_outputs(k))
            for t in diff:
                need[t] = True
            blocked.update((t, k) for t in _float_slots(tape, k.outputs, range(len(k.outputs)))
                           if t not in diff)
    reach = [False] * len(tape.tensors)
    reach[tape.kernels[loss_kernel].outputs[0]] = True
    active = [False] * n
    expected: dict[int, int] = {}
    for kid in range(n - 1, -1, -1):
        k = tape.kernels[kid]
        rule = RULES[k.op_type]
        outs = _float_slots(tape, k.outputs, rule.diff_outputs(k))
        if not any(reach[t] and need[t] for t in outs):
            continue
        active[kid] = True
        for t in _float_slots(tape, k.inputs, rule.diff_inputs(k)):
            if t in blocked:
                _blocked_error(tape, blocked[t], t)
            reach[t] = True
            if need[t]:
                expected[t] = expected.get(t, 0) + 1
    has_grad = [a and b for a, b in zip(need, reach, strict=True)]
    return _Flow(has_grad, active, expected)


def _blocked_error(tape: Tape, k: KernelDraft, t: int) -> None:
    raise UnsupportedOpError(
        k.op_type, node=k.name, what=f"the training derivation: the loss depends on its output "
        f"{tape.name(t)!r}, which has no gradient rule; do not use that output")


# ---- the reverse pass -----------------------------------------------------------------------
def _backward(tape: Tape, flow: _Flow, loss_kernel: int) -> dict[int, int]:
    """Emit backward kernels in reverse order; return {weight: its final gradient}."""
    pending: dict[int, int] = {}
    received: dict[int, int] = {}
    for kid in range(loss_kernel, -1, -1):
        if not flow.active[kid]:
            continue
        k = tape.kernels[kid]
        rule = RULES[k.op_type]
        diff_in, diff_out = set(rule.diff_inputs(k)), set(rule.diff_outputs(k))
        dys = [pending.get(t) if i in diff_out else None for i, t in enumerate(k.outputs)]
        needs = [i in diff_in and flow.has_grad[t] for i, t in enumerate(k.inputs)]
        grads = rule.backward(tape, k, dys, needs)
        for slot, x in enumerate(k.inputs):
            if needs[slot]:
                _add_partial(tape, k, x, grads[slot], pending, received)
    weights = {}
    for t, g in pending.items():
        if tape.tensors[t].role == Role.WEIGHT and tape.tensors[t].dtype in FLOAT_DTYPES:
            tape.tensors[g].role = Role.WEIGHT_GRADIENT
            weights[t] = g
    return weights


def _add_partial(tape: Tape, k: KernelDraft, x: int, g: int | None, pending: dict[int, int],
                 received: dict[int, int]) -> None:
    """Sum a new partial gradient of x into the running one (GradAccumulate), eagerly."""
    if g is None or tape.shape(g) != tape.shape(x) or tape.dtype(g) != tape.dtype(x):
        got = None if g is None else (tape.shape(g), tape.dtype(g))
        raise GraphError(f"training rule of {k.op_type} ({k.name!r}) gave gradient {got} for "
                         f"{tape.name(x)!r} of {(tape.shape(x), tape.dtype(x))}; a rule bug")
    count = received.get(x, 0) + 1
    received[x] = count
    if x not in pending:
        pending[x] = g
        return
    name = tape.name(x)
    last = count == tape.expected.get(x, count)
    role = tape.tensors[g].role
    out = tape.new_tensor(f"grad::{name}" if last else f"grad::{name}::sum", tape.shape(x),
                          tape.dtype(x), role)
    tape.emit("GradAccumulate", [pending[x], g], [out], f"accumulate/{name}")
    pending[x] = out


# ---- pruning and freezing -------------------------------------------------------------------
def _live_kernels(tape: Tape, n_forward: int, outputs: list[int]) -> list[bool]:
    """Backward kernels none of whose outputs is read (or a graph output) are dropped."""
    live = set(outputs)
    keep = [True] * len(tape.kernels)
    for kid in range(len(tape.kernels) - 1, -1, -1):
        k = tape.kernels[kid]
        if kid >= n_forward and not any(o in live for o in k.outputs):
            keep[kid] = False
            continue
        live.update(k.inputs)
    return keep


def _freeze(graph: TensorGraph, tape: Tape, n_forward: int, outputs: list[int],
            meta: dict[str, object]) -> TensorGraph:
    """Renumber the kept tensors (forward ids unchanged) and build the frozen graph."""
    keep = _live_kernels(tape, n_forward, outputs)
    kernels = [k for k, kept in zip(tape.kernels, keep, strict=True) if kept]
    used = set(outputs) | set(graph.inputs)
    for k in kernels:
        used.update(k.inputs)
        used.update(k.outputs)
    remap = {old: new for new, old in enumerate(sorted(used))}
    b = GraphBuilder(f"{graph.name}/train")
    for old in sorted(used):
        t = tape.tensors[old]
        b.add_tensor(t.name, t.shape, t.dtype, t.role)
    for k in kernels:
        b.add_kernel(k.op_type, [remap[t] for t in k.inputs], [remap[t] for t in k.outputs],
                     name=k.name, domain=k.domain, attrs=k.attrs,
                     workspace_bytes=k.workspace_bytes)
    b.constants.update({remap[t]: v for t, v in graph.constants.items() if t in remap})
    if "lr_tensor" in meta:  # the learning rate as a tensor: its value, in float32
        b.constants[remap[meta["lr_tensor"]]] = np.asarray(  # type: ignore[index]
            meta["learning_rate"], dtype=np.float32)
    labels = meta["labels"]
    b.inputs = [remap[t] for t in graph.inputs]
    if remap[labels] not in b.inputs:  # type: ignore[index]
        b.inputs.append(remap[labels])  # type: ignore[index]
    b.outputs = [remap[t] for t in outputs]
    b.carried = [(remap[a], remap[z]) for a, z in tape.carried]
    meta = _remap_meta(meta, remap)
    b.meta = {**graph.meta, "training": meta}
    return b.build()


def _remap_meta(meta: dict[str, object], remap: dict[int, int]) -> dict[str, object]:
    out = dict(meta)
    for key in ("loss", "labels", "lr_tensor"):
        if key in meta:
            out[key] = remap[meta[key]]  # type: ignore[index]
    out["weight_grads"] = tuple((remap[w], remap[g])
                                for w, g in meta["weight_grads"])  # type: ignore[attr-defined]
    return out
