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

F = TypeVar("F", bound=Callable[..., Any])


no_fuse_option = click.option(
    "--no-fuse", is_flag=True,
    help="Keep attention and GELU unfused, as the file has them (by default scaled dot-product "
         "attention and GELU patterns become one kernel each; docs/fusion.md).")


def model_options(func: F) -> F:
    """MODEL argument plus --batch, --dim, --training, --optimizer, --no-fuse."""
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
    return api.load_model(model, batch=batch, dims=parse_dims(dims), training=training,
                          optimizer=optimizer, fuse=not no_fuse)


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
