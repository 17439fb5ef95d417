"""Split backward kernels that set a budget's floor (`split_conv_grads`): fused convolution
backward kernels into their parts, recurrent layers and their gradient kernels into chunks.

The training rules (`ir/rules/nn.py`) give a convolution whose input and filter both need
gradients one `ConvGrad` kernel (dY, X, W -> dX, dW[, dB]), as autograd runs one
`convolution_backward`: its working set holds dY, X, W, dX and dW at once, and on large images
that one kernel can set the smallest feasible budget of the whole graph (a U-Net's 69% of its
peak). The same work as separate kernels, ConvGradFilter (dY, X -> dW), ConvGradBias (dY -> dB)
then ConvGradData (dY, W -> dX), never holds X and dX together: on a GPU torch runs the data
and filter gradients as two cuDNN calls anyway, so the split costs about one launch. The
planner splits the kernels that keep a budget infeasible (`pipeline.optimize`,
`--split-conv-grads`; docs/planning.md, "Splitting convolution backward kernels").

A recurrent layer (`LSTM`, `GRU`) computes every step's input gates at once, and its gradient
kernel (`LSTMGrad`, `GRUGrad`: `ir/rules/recurrent.py`) recomputes the forward of the whole
sequence inside itself, a tape of 15 (LSTM) or 12 (GRU) times its output Y: temporaries that can
be most of a model's peak. Their split is the same kernel run over `batch_chunks` segments of
its sequence in turn (`kernels/recurrent.py`; `in_sequence_chunks`): each segment starts from
the last one's final states, and the gradient kernel back-propagates one segment at a time from
the states at their boundaries, so the temporaries shrink by that factor for one forward more
in the gradient kernel (`SEQUENCE_GRAD_EXTRA`). A bidirectional layer runs over slices of its
batch instead (the sequences of a batch are independent), which on a GPU costs about that many
times the whole: a recurrence's time is its steps' latency. The chunk count is the shapes'
default (`recurrent_chunks`) or one the planner fits to a budget, written into the split list
("<name>#<chunks>"), so a plan's list rebuilds the same graph.

A split graph records the names of the kernels it split under `META_KEY`, which
`options.ModelOptions.of_graph` reads back, so a plan made for it rebuilds it.
"""

from __future__ import annotations

from collections.abc import Iterable

from autotm_py.errors import GraphError
from autotm_py.ir.builder import GraphBuilder
from autotm_py.ir.graph import Kernel, TensorGraph
from autotm_py.ir.layout import META_KEY as LAYOUT_KEY
from autotm_py.ir.layout import is_channels_last, to_channels_last
from autotm_py.ir.rules.recurrent import RECURRENT_TRAINING_OPS
from autotm_py.options import SPLIT_KEY

META_KEY = SPLIT_KEY  # graph.meta[META_KEY]: the names of the fused kernels split

# fused op -> (its data part, its filter part): what the training rules emit where only one
# gradient is needed (`ir/rules/nn.py`, `_conv_like`); profiling prices a fused kernel from
# them (`profiling.sources.PARTS`)
CONV_GRAD_PARTS = {"ConvGrad": ("ConvGradData", "ConvGradFilter"),
                   "ConvTransposeGrad": ("ConvTransposeGradData", "ConvTransposeGradFilter")}
BIAS_PART = "ConvGradBias"
RECURRENT_OPS = ("LSTM", "GRU", *RECURRENT_TRAINING_OPS)
# forward convolutions a split may run in batch chunks, only where an entry gives the count
# (their workspace is measured, not in the IR: `feasibility.splits_for_budget` fits it)
FORWARD_CONVS = ("Conv", "ConvRelu")
# the most batch chunks of convolutions a profile measures (`split_variants`): more are priced
# from the whole kernel (`KernelCosts.spliced`)
PROFILED_CONV_CHUNKS = 8
CHUNKS_ATTR = "batch_chunks"  # slices of a kernel's batch (or a recurrence's sequence) in turn
# a recurrent gradient kernel in sequence chunks runs its forward once more, without a tape, for
# the segments' boundary states: about a third of the whole kernel (a forward and a backward)
SEQUENCE_GRAD_EXTRA = 1 / 3
# a split list names a recurrent kernel split into chunks other than its default
# (`recurrent_chunks`) as "<name>#<chunks>": the planner fits them to a budget
CHUNKS_SEP = "#"


def fused_conv_grads(graph: TensorGraph) -> list[int]:
    """The ids of the fused convolution backward kernels of `graph`."""
    return [k.id for k in graph.kernels if k.op_type in CONV_GRAD_PARTS]


def recurrent_chunks(graph: TensorGraph, k: Kernel) -> int:
    """The batch chunks a split of recurrent kernel `k` runs in by default: the fewest (a power
    of two, at most the batch) that bring its temporaries (its IR workspace) to at most its
    largest input or output, so that it needs at most that much more than its operands. 1: it
    needs no split."""
    largest = max(graph.tensors[t].nbytes for t in k.io)
    return chunks_to_fit(graph, k, k.workspace_bytes, largest)


def chunks_to_fit(graph: TensorGraph, k: Kernel, tape_bytes: int, room: int) -> int:
    """The fewest chunks (a power of two, at most `most_chunks`: the sequence's steps or the
    batch) in which recurrent kernel `k`'s temporaries of `tape_bytes` take at most `room`
    bytes; the most it can take where none does."""
    most = most_chunks(graph, k)
    chunks = 1
    while chunks < most and -(-tape_bytes // chunks) > room:
        chunks *= 2
    return min(chunks, most)


def in_sequence_chunks(k: Kernel) -> bool:
    """Whether recurrent kernel `k` chunks its sequence rather than its batch: every
    one-directional layer (a bidirectional one's two directions run from both ends)."""
    return k.op_type in RECURRENT_OPS and k.attr("direction", "forward") != "bidirectional"


def chunked_time_factor(k: Kernel) -> float:
    """The multiple of its whole kernel's time at which kernel `k`, in chunks, is priced until
    measured: a recurrent kernel in sequence chunks does the same steps at the same batch (its
    gradient kernel one forward more, `SEQUENCE_GRAD_EXTRA`); k slices of a batch take up to k
    times (a recurrence's steps are sequential, a slice of a convolution fills less of the
    GPU)."""
    if not in_sequence_chunks(k):
        return float(k.attr(CHUNKS_ATTR, 1))
    return 1 + SEQUENCE_GRAD_EXTRA if k.op_type.endswith("Grad") else 1.0


def most_chunks(graph: TensorGraph, k: Kernel) -> int:
    """The most chunks a chunkable kernel `k` can take: its sequence's steps (a recurrent
    kernel in sequence chunks) or its batch."""
    x = graph.tensors[k.inputs[0]].shape  # X: (T, B, I), batch first in layout 1; dY (N, C, ...)
    if k.op_type not in RECURRENT_OPS:
        return x[0]
    layout = int(k.attr("layout", 0))
    return x[layout] if in_sequence_chunks(k) else x[1 - layout]


def split_variants(graph: TensorGraph) -> list[TensorGraph]:
    """The split graphs a profile measures, so that any split the planner makes of `graph` is
    priced with its own kernels' times: every kernel split as `split_conv_grads` does by
    default, then each other power-of-two count of batch chunks (up to the batch) for all its
    recurrent kernels, fused convolution backward kernels' parts and forward convolutions at
    once (convolutions up to `PROFILED_CONV_CHUNKS`). [] where nothing splits."""
    ids = splittable_kernels(graph)
    if not ids:
        return []
    default = split_conv_grads(graph)
    chunkable = [graph.kernels[k] for k in [*ids, *forward_convs(graph)]]
    done = {tuple(sorted(split_names(default)))}
    out = [default]
    chunks = 2
    while chunkable and chunks <= max(most_chunks(graph, k) for k in chunkable):
        names = tuple(sorted(chunked_name(k.name, min(chunks, most_chunks(graph, k)))
                             for k in chunkable if k.op_type in RECURRENT_OPS or
                             chunks <= PROFILED_CONV_CHUNKS))
        if names and names not in done:
            done.add(names)
            out.append(split_conv_grads(graph, names))
        chunks *= 2
    return out


def forward_convs(graph: TensorGraph) -> list[int]:
    """The ids of the forward convolutions of `graph` a split may run in batch chunks."""
    return [k.id for k in graph.kernels
            if k.op_type in FORWARD_CONVS and int(k.attr(CHUNKS_ATTR, 1)) == 1]


def chunked_name(name: str, chunks: int) -> str:
    """A split list's entry for a recurrent kernel in `chunks` chunks, or a fused convolution
    backward kernel split into parts that each run in `chunks` chunks."""
    return f"{name}{CHUNKS_SEP}{chunks}"


def _parse(entry: str, names: Iterable[str]) -> tuple[str, int | None]:
    """(kernel name, chunks or None) of a split list's entry, given the kernels' `names` (a
    kernel whose own name ends in "#<digits>" is that kernel)."""
    name, sep, chunks = entry.rpartition(CHUNKS_SEP)
    if entry not in names and sep and chunks.isdigit() and int(chunks) > 0:
        return name, int(chunks)
    return entry, None


def entry_kernel(entry: str, graph: TensorGraph) -> str:
    """The name of the kernel of `graph` a split list's entry names."""
    return _parse(entry, {k.name for k in graph.kernels})[0]


def _chunkable(graph: TensorGraph, k: Kernel) -> bool:
    return k.op_type in RECURRENT_OPS and int(k.attr(CHUNKS_ATTR, 1)) == 1 and \
        recurrent_chunks(graph, k) > 1


def splittable_kernels(graph: TensorGraph) -> list[int]:
    """The ids of the kernels of `graph` a split would change: its fused convolution backward
    kernels and the recurrent kernels whose temporaries outweigh their largest operand."""
    return [k.id for k in graph.kernels
            if k.op_type in CONV_GRAD_PARTS or _chunkable(graph, k)]


def describe_split(graph: TensorGraph, names: Iterable[str]) -> str:
    """What splitting the kernels `names` (split list entries) of `graph` does, in words."""
    by_name = {k.name: k for k in graph.kernels}
    entries = [_parse(n, by_name) for n in names]
    ops = [by_name[name].op_type for name, _ in entries]
    conv = sum(op in CONV_GRAD_PARTS for op in ops)
    sliced = sum(op in CONV_GRAD_PARTS and (chunks or 1) > 1
                 for op, (_, chunks) in zip(ops, entries, strict=True))
    forward = sum(op in FORWARD_CONVS for op in ops)
    rnn = len(ops) - conv - forward
    sequence = sum(in_sequence_chunks(by_name[name]) for name, _ in entries)
    parts = []
    if conv:
        parts.append(f"{conv} convolution backward kernel{'s' if conv > 1 else ''} into "
                     f"{'their' if conv > 1 else 'its'} filter and data parts" +
                     (f" ({sliced} in chunks of the batch)" if sliced else ""))
    for count, what, of in ((forward, "convolution", "batch"),
                            (rnn - sequence, "recurrent kernel", "batch"),
                            (sequence, "recurrent kernel", "sequence")):
        if count:
            parts.append(f"{count} {what}{'s' if count > 1 else ''} into chunks of the {of}")
    return " and ".join(parts)


def split_names(graph: TensorGraph) -> tuple[str, ...]:
    """The names of the fused kernels a split graph split (() for any other graph)."""
    return tuple(graph.meta.get(META_KEY) or ())


def split_conv_grads(graph: TensorGraph, names: Iterable[str] | None = None) -> TensorGraph:
    """`graph` with each kernel named in `names` (None: every one `splittable_kernels` gives)
    split: a fused convolution backward kernel replaced, at its place, by ConvGradFilter
    (dY, X -> dW), ConvGradBias (dY -> dB) where it computed dB, then ConvGradData (dY, W ->
    dX), those two parts run in batch chunks where its entry gives a count ("<name>#<chunks>",
    `chunked_name`); a recurrent kernel (a layer or its gradient) run in batch chunks,
    `recurrent_chunks` of them or the count its entry gives; a forward convolution (Conv,
    ConvRelu) run in the batch chunks its entry gives. The tensors (ids, names, roles)
    are the same; the kernels after a split convolution move up by one or two ids. A graph
    without those kernels comes back unchanged. A name that is no such kernel of `graph` is a
    `GraphError`."""
    kernels = {graph.kernels[k].name: graph.kernels[k] for k in splittable_kernels(graph)}
    entries = [kernels[n].name for n in kernels] if names is None else list(names)
    convs = {graph.kernels[k].name: graph.kernels[k] for k in forward_convs(graph)}
    wanted = dict(_parse(e, {**kernels, **convs}) for e in entries)
    # a forward convolution only in chunks
    kernels.update({n: k for n, k in convs.items() if (wanted.get(n) or 1) > 1})
    unknown = sorted(set(wanted) - set(kernels))
    if unknown:
        raise GraphError(f"cannot split {', '.join(map(repr, unknown[:3]))}: no fused "
                         "convolution backward kernel, recurrent kernel with temporaries to "
                         "chunk or convolution given a count of chunks (\"<name>#<chunks>\") "
                         f"of that name in graph {graph.name!r}")
    if not wanted:
        return graph
    b = GraphBuilder(graph.name)
    for t in graph.tensors:
        b.add_tensor(t.name, t.shape, t.dtype, t.role)
    b.constants.update(graph.constants)
    recorded = []
    for k in graph.kernels:
        if k.name in wanted and k.op_type in (*RECURRENT_OPS, *FORWARD_CONVS):
            chunks = min(wanted[k.name] or recurrent_chunks(graph, k), most_chunks(graph, k))
            b.add_kernel(k.op_type, k.inputs, k.outputs, name=k.name, domain=k.domain,
                         attrs={**k.attrs_dict, CHUNKS_ATTR: chunks},
                         workspace_bytes=-(-k.workspace_bytes // chunks))
            recorded.append(chunked_name(k.name, chunks))
        elif k.name in wanted:
            chunks = min(wanted[k.name] or 1, most_chunks(graph, k))
            _add_parts(b, graph, k, chunks)
            recorded.append(k.name if chunks == 1 else chunked_name(k.name, chunks))
        else:
            b.add_kernel(k.op_type, k.inputs, k.outputs, name=k.name, domain=k.domain,
                         attrs=k.attrs_dict, workspace_bytes=k.workspace_bytes)
    b.inputs, b.outputs, b.carried = list(graph.inputs), list(graph.outputs), list(graph.carried)
    meta = {key: value for key, value in graph.meta.items() if key != LAYOUT_KEY}
    b.meta = {**meta, META_KEY: tuple(sorted({*split_names(graph), *recorded}))}
    out = b.build()
    # the same tensors channels-last: each part joins tensors the fused kernel joined
    return to_channels_last(out) if is_channels_last(graph) else out


def part_operands(k: Kernel) -> list[list[int]]:
    """The inputs and outputs of each part of fused kernel `k`: its filter part (dY, X, dW),
    its data part (dY, W, dX) and, where it computes dB, its bias part (dY, dB)."""
    dy, x, w = k.inputs[:3]
    dx, dw = k.outputs[:2]
    return [[dy, x, dw], [dy, w, dx], *([[dy, k.outputs[2]]] if len(k.outputs) > 2 else [])]


def _add_parts(b: GraphBuilder, graph: TensorGraph, k: Kernel, chunks: int = 1) -> None:
    """The parts of fused kernel `k`, in the order that holds the least at once; the filter
    and data parts over `chunks` slices of the batch (their workspace a slice's).

    Filter first: ConvGradFilter holds dY, X and dW; then X, where no later kernel reads it,
    is dead before ConvGradData makes dX, which then holds dY, W, dX (and dW, alive until its
    update). Data first would hold X beside dX (the filter part still reads X): one
    activation-sized tensor more at its peak, where dW and W are filter-sized. The bias part
    reads only dY and goes between them, so dY dies with the last part as it did with `k`."""
    data_op, filter_op = CONV_GRAD_PARTS[k.op_type]
    (dy, x, dw), (_, w, dx), *bias = part_operands(k)
    attrs = {key: value for key, value in k.attrs_dict.items() if key != "output_mask"}
    if chunks > 1:
        attrs[CHUNKS_ATTR] = chunks
    stem = k.name.removesuffix("/grad")  # the rules' names: <conv>/grad -> <conv>/grad_data
    tensors = graph.tensors
    # each part keeps the fused kernel's own workspace (none from the rules: measured
    # workspace comes with the costs, `KernelCosts.spliced`)
    workspace = -(-k.workspace_bytes // chunks)
    b.add_kernel(filter_op, [dy, x], [dw], name=f"{stem}/grad_filter", domain=k.domain,
                 attrs={**attrs, "shape": tensors[dw].shape}, workspace_bytes=workspace)
    for _, db in bias:
        b.add_kernel(BIAS_PART, [dy], [db], name=f"{stem}/grad_bias", domain=k.domain,
                     attrs={"shape": tensors[db].shape})
    b.add_kernel(data_op, [dy, w], [dx], name=f"{stem}/grad_data", domain=k.domain,
                 attrs={**attrs, "shape": tensors[dx].shape}, workspace_bytes=workspace)


def part_origins(graph: TensorGraph, split: TensorGraph) -> list[tuple[int, bool]]:
    """For each kernel of `split` (`split_conv_grads(graph, ...)`): the id of the kernel of
    `graph` it is or is a part of, and whether it is a part (a chunked recurrent kernel is
    its own one part). The split keeps the order."""
    out: list[tuple[int, bool]] = []
    j = 0
    for k in graph.kernels:
        mine = split.kernels[j] if j < len(split.kernels) else None
        if mine is not None and mine.op_type == k.op_type and mine.name == k.name:
            chunked = int(mine.attr(CHUNKS_ATTR, 1)) != int(k.attr(CHUNKS_ATTR, 1))
            out.append((k.id, chunked))
            j += 1
            continue
        if k.op_type not in CONV_GRAD_PARTS:
            raise GraphError(f"graph {split.name!r} is no split of {graph.name!r}: kernel "
                             f"#{k.id} {k.name!r} is missing")
        parts = len(part_operands(k))
        out.extend([(k.id, True)] * parts)
        j += parts
    return out
