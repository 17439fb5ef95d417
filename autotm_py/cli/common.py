"""Options and helpers shared by several commands."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from autotm_py import api
from autotm_py.config import MAX_FOOTPRINT_BYTES, MAX_HEADROOM, SCRATCH_MODES
from autotm_py.errors import ConfigError, MissingDependencyError
from autotm_py.fileio import write_problem
from autotm_py.ir.loss import LOSSES
from autotm_py.plan import Plan
from autotm_py.units import format_bytes

F = TypeVar("F", bound=Callable[..., Any])

# --loss is read by `load_model_from_cli` from the click context rather than passed through
# every command's signature: every command that loads a model takes it, none uses it otherwise.
LOSS_KEY, LOSS_CHUNKS_KEY = "autotm.loss", "autotm.loss_chunks"
CHANNELS_LAST_KEY = "autotm.channels_last"
# Model options a command leaves unset (None) take these values, or, for a command that reads
# a plan (simulate, run, report --model), the plan's (`PlanHeader.model`).
DEFAULT_OPTIMIZER, DEFAULT_LOSS = "sgd", "auto"
FROM_PLAN = ("Not given: the plan's, for commands that read a plan (simulate, run, report "
             "--model).")


def _remember(key: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A click callback that keeps the option's value in the context under `key`."""
    def callback(ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
        ctx.meta[key] = value
        return value
    return callback


loss_option = click.option(
    "--loss", type=click.Choice(LOSSES), default=None, expose_value=False,
    callback=_remember(LOSS_KEY),
    help="Loss that --training appends when the model has none: auto (from the output's "
         "shape: N x C classifiers and N x C x H x W per-pixel classes on axis 1, N x T x V "
         "sequence models on the last axis), ce-axis1, ce-last (softmax cross-entropy over "
         f"that axis) or mse (mean squared error) [default: auto]. {FROM_PLAN} See "
         "docs/training.md.")


loss_chunks_option = click.option(
    "--loss-chunks", type=click.IntRange(min=1), default=None, expose_value=False,
    callback=_remember(LOSS_CHUNKS_KEY), metavar="N",
    help="With --training: a language model's output layer and its softmax cross-entropy as "
         "one kernel that goes through the tokens in N blocks, so the logits (tokens x "
         "vocabulary) never exist whole: what lets BERT-base or GPT-2 small train in a "
         "quarter of their memory. 1 keeps the plain loss [default: 1]. Only for a loss over "
         f"the last axis of a Linear layer's output. {FROM_PLAN} See docs/training.md.")


channels_last_option = click.option(
    "--channels-last", is_flag=True, default=None, expose_value=False,
    callback=_remember(CHANNELS_LAST_KEY),
    help="Store the convolutions' images N, H, W, C (torch's channels_last) instead of N, C, "
         "H, W: cuDNN's fastest convolutions on tensor cores, with smaller workspaces. Same "
         "bytes, so the same plans; its own kernel profiles (`autotm profile --channels-last`). "
         f"Models without convolutions are unchanged. {FROM_PLAN} See docs/layout.md.")


no_fuse_option = click.option(
    "--no-fuse", is_flag=True, default=None,
    help="Keep the graph unfused, as the file has it (by default scaled dot-product attention, "
         "GELU, Linear layers and convolution + ReLU pairs become one kernel each; "
         f"docs/fusion.md). {FROM_PLAN}")


def model_options(func: F) -> F:
    """MODEL argument plus --batch, --dim, --training, --optimizer, --loss, --loss-chunks,
    --channels-last, --no-fuse. Unset
    options are None, so that a command reading a plan can take them from it."""
    decorators = [
        click.argument("model"),
        click.option("--batch", "-b", type=int, default=None,
                     help="Bind the first dimension of every input (the batch size). --batch "
                          "and --dim go together: given neither, a command that reads a plan "
                          "takes both from it."),
        click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE",
                     help="Bind a symbolic dimension (repeatable), e.g. --dim seq=128."),
        click.option("--training", is_flag=True, default=None,
                     help="One training iteration (forward, loss, backward, optimizer update) "
                          f"instead of inference. {FROM_PLAN}"),
        click.option("--optimizer", type=click.Choice(["sgd", "adam"]), default=None,
                     help=f"Weight update used with --training [default: sgd]. {FROM_PLAN}"),
        loss_option,
        loss_chunks_option,
        channels_last_option,
        no_fuse_option,
    ]
    for deco in reversed(decorators):
        func = deco(func)
    return func


headroom_option = click.option(
    "--headroom", type=click.FloatRange(0, MAX_HEADROOM, max_open=True), default=0.0,
    show_default=True,
    help="Share of the budget the plan leaves free for the allocator's fragmentation (the ILP "
         "counts live bytes; a real heap needs more). Try 0.1 when `autotm run` reports "
         "allocator retries or runs out of memory under the cap.")
arena_option = click.option(
    "--arena", is_flag=True,
    help="GPU mode: give every fast-memory buffer a planned offset in one arena and fit the "
         "packed arena in the budget (re-solving tighter where it does not fit), so the plan "
         "runs at planned addresses without --headroom (`autotm run --arena`).")
scratch_option = click.option(
    "--scratch", type=click.Choice(SCRATCH_MODES), default="auto", show_default=True,
    help="With --arena and --placed: where kernels' workspaces and the outputs they allocate "
         "beside their slots live. windows: a window inside the arena for each kernel with 1 MiB "
         "of scratch or more, live only while it runs, so that memory holds tensors the rest "
         "of the time (smaller scratch shares a region under 1 MiB); region: one region beside "
         "the arena, as large as the largest kernel's, for the whole iteration; auto: windows "
         "with --arena and --placed, else the region.")
graph_option = click.option(
    "--graph", "graph_replay", is_flag=True,
    help="GPU mode: price the iteration as replayed from a CUDA graph (kernels at their device "
         "times, no host dispatch), as `autotm run --graph` runs it: with --arena at planned "
         "addresses, else with static inputs on torch's allocator (give --headroom).")
gpu_option = click.option(
    "--gpu", default=None, metavar="NAME",
    help="GPU mode: price with the profiles of this GPU (its name, or a part of one that "
         "names one GPU with shipped or cached profiles: h100, h200), to plan here for the GPU "
         "that will run the plan [default: this machine's GPU, else the shipped H100 "
         "profiles]. The plan records it; simulate and report price the plan the same.")
reserve_option = click.option(
    "--reserve", default=None, metavar="BYTES",
    help="Fast memory the runtime keeps for itself whatever the plan, taken out of the budget "
         "before the plan's tensors [default: the memory system's runtime_reserve_bytes: "
         "68MiB for h100-pcie5 (torch's cuBLAS workspaces), 0 in host mode]. --reserve 0 "
         "plans the tensors alone (docs/memory-systems.md).")
json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print machine-readable JSON instead of tables.")


def budget_parts(budget: int, reserve: int, plannable: int | None, scratch: int = 0) -> str:
    """'68.00 MiB runtime reserve + 7.85 MiB headroom + 81.95 MiB for the plan's tensors';
    `scratch` (arena mode: the scratch region and bytes held back for the packing) is named
    between the headroom and the tensors."""
    tensors = max(plannable or 0, 0)
    headroom = max(budget - reserve - scratch - tensors, 0)
    region = f"{format_bytes(scratch)} arena scratch + " if scratch else ""
    text = (f"{format_bytes(reserve)} runtime reserve + {format_bytes(headroom)} headroom + "
            f"{region}{format_bytes(tensors)} for the plan's tensors")
    if reserve > budget:
        text += " (the reserve alone exceeds the budget)"
    return text


def fast_peak_line(peak: int, budget: int | None, reserve: int, plannable: int | None) -> str:
    """The fast-tier peak of a plan's tensors against what they may use and the budget."""
    if budget is None:
        return f"fast peak  {format_bytes(peak)}"
    if reserve == 0 and plannable == budget:
        return f"fast peak  {format_bytes(peak)} of the {format_bytes(budget)} budget"
    return (f"fast peak  {format_bytes(peak)} of the {format_bytes(plannable or 0)} for tensors "
            f"({format_bytes(peak + reserve)} with the reserve, budget {format_bytes(budget)})")


def parse_dims(values: Sequence[str] | None) -> dict[str, int]:
    """['batch=32', 'seq=128'] -> {'batch': 32, 'seq': 128}; a bad item is a ConfigError."""
    dims: dict[str, int] = {}
    for item in values or ():
        name, sep, value = item.partition("=")
        try:
            if not sep or not name.strip():
                raise ValueError
            number = int(value)
            if number <= 0:
                raise ValueError
        except ValueError:
            raise ConfigError(f"--dim {item!r}: expected NAME=VALUE with a positive integer, e.g. "
                              "--dim batch=32") from None
        dims[name.strip()] = number
    return dims


def load_model_from_cli(model: str, batch: int | None, dims: Sequence[str] | None,
                        training: bool | None, optimizer: str | None,
                        no_fuse: bool | None = None, plan: Plan | None = None) -> Any:
    """The graph that MODEL (an ONNX file or a zoo name) and the model options describe.

    Options left unset (None, or no --batch and no --dim) take their defaults, or with `plan`
    the values recorded in its header (`PlanHeader.model`), so that `simulate`, `run` and
    `report --model` rebuild the graph the plan was made for. With `plan`, the graph is checked
    against it (`Plan.validate`: a mismatch names the options that differ)."""

    if batch is not None and batch <= 0:
        raise ConfigError(f"--batch {batch}: must be a positive integer")
    ctx = click.get_current_context(silent=True)
    loss = ctx.meta.get(LOSS_KEY) if ctx is not None else None
    chunks = ctx.meta.get(LOSS_CHUNKS_KEY) if ctx is not None else None
    channels_last = ctx.meta.get(CHANNELS_LAST_KEY) if ctx is not None else None
    bound = parse_dims(dims)
    recorded = plan.header.model if plan is not None else None
    if recorded is not None:
        if batch is None and not bound:
            batch, bound = recorded.batch, dict(recorded.dims)
        training = recorded.training if training is None else training
        optimizer = optimizer or recorded.optimizer
        loss = loss or recorded.loss
        chunks = chunks or recorded.loss_chunks
        channels_last = recorded.channels_last if channels_last is None else channels_last
        no_fuse = (not recorded.fuse) if no_fuse is None else no_fuse
    graph = api.load_model(model, batch=batch, dims=bound, training=bool(training),
                           optimizer=optimizer or DEFAULT_OPTIMIZER, fuse=not no_fuse,
                           loss=loss or DEFAULT_LOSS, loss_chunks=chunks or 1,
                           channels_last=bool(channels_last))
    check_footprint(graph)
    if plan is not None:
        plan.validate(graph)
    return graph


def check_footprint(graph: Any) -> None:
    """Refuse a model whose unconstrained peak exceeds any machine's memory: a typo in --batch
    or --dim (e.g. --dim batch=100000000) would otherwise be planned without a word."""
    peak = int(graph.peak_live_bytes)
    if peak > MAX_FOOTPRINT_BYTES:
        dims = " ".join(f"{k}={v}" for k, v in (graph.meta.get("dims") or {}).items())
        raise ConfigError(f"{graph.name}: one iteration needs {format_bytes(peak)} at its peak "
                          f"({dims or 'the dims of the file'}), more than "
                          f"{format_bytes(MAX_FOOTPRINT_BYTES)}, the most memory one machine "
                          "has; check --batch and --dim")


def check_writable(path: str | None, flag: str, *, directory: bool = False) -> None:
    """Refuse an output path that cannot be written, before any long work starts."""
    if path is None:
        return
    why = write_problem(path, directory=directory)
    if why is not None:
        raise ConfigError(f"{flag} {path}: cannot write there ({why}); give a path in a "
                          "writable folder")


def warn(message: str) -> None:
    """One line on stderr, beside the command's output."""
    click.echo(f"warning: {message}", err=True)


def require(module: str, needed_by: str) -> None:
    """Stop at once, in one line naming the extra to install, when `module` is missing (before
    a model is loaded or a plan read, not after)."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != module:
            raise
        raise MissingDependencyError(module, needed_by) from None


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
