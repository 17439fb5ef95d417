"""Options and helpers shared by several commands."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from autotm_py import api
from autotm_py.config import MAX_HEADROOM
from autotm_py.errors import ConfigError
from autotm_py.ir.loss import LOSSES

F = TypeVar("F", bound=Callable[..., Any])

# --loss is read by `load_model_from_cli` from the click context rather than passed through
# every command's signature: every command that loads a model takes it, none uses it otherwise.
LOSS_KEY = "autotm.loss"


def _remember_loss(ctx: click.Context, _param: click.Parameter, value: str) -> str:
    ctx.meta[LOSS_KEY] = value
    return value


loss_option = click.option(
    "--loss", type=click.Choice(LOSSES), default="auto", show_default=True,
    expose_value=False, callback=_remember_loss,
    help="Loss that --training appends when the model has none: auto (from the output's "
         "shape: N x C classifiers and N x C x H x W per-pixel classes on axis 1, N x T x V "
         "sequence models on the last axis), ce-axis1, ce-last (softmax cross-entropy over "
         "that axis) or mse (mean squared error). See docs/training.md.")


no_fuse_option = click.option(
    "--no-fuse", is_flag=True,
    help="Keep attention and GELU unfused, as the file has them (by default scaled dot-product "
         "attention and GELU patterns become one kernel each; docs/fusion.md).")


def model_options(func: F) -> F:
    """MODEL argument plus --batch, --dim, --training, --optimizer, --loss, --no-fuse."""
    decorators = [
        click.argument("model"),
        click.option("--batch", "-b", type=int, default=None,
                     help="Bind the first dimension of every input (the batch size)."),
        click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE",
                     help="Bind a symbolic dimension (repeatable), e.g. --dim seq=128."),
        click.option("--training", is_flag=True,
                     help="One training iteration (forward, loss, backward, optimizer update) "
                          "instead of inference."),
        click.option("--optimizer", type=click.Choice(["sgd", "adam"]), default="sgd",
                     show_default=True, help="Weight update used with --training."),
        loss_option,
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
graph_option = click.option(
    "--graph", "graph_replay", is_flag=True,
    help="GPU mode: price the iteration as replayed from a CUDA graph (kernels at their device "
         "times, no host dispatch), as `autotm run --graph` runs it.")
json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print machine-readable JSON instead of tables.")


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
                        training: bool, optimizer: str, no_fuse: bool = False) -> Any:
    """The graph that MODEL (an ONNX file or a zoo name) and the model options describe."""

    if batch is not None and batch <= 0:
        raise ConfigError(f"--batch {batch}: must be a positive integer")
    ctx = click.get_current_context(silent=True)
    loss = ctx.meta.get(LOSS_KEY, "auto") if ctx is not None else "auto"
    return api.load_model(model, batch=batch, dims=parse_dims(dims), training=training,
                          optimizer=optimizer, fuse=not no_fuse, loss=loss)


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
