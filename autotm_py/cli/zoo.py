"""`autotm zoo list` and `autotm zoo export NAME -o FILE`: the model zoo from the command line."""

from __future__ import annotations

import click

from autotm_py.cli import cli
from autotm_py.cli.common import check_writable, json_option, print_json
from autotm_py.frontend import ZOO, build_model, count_params, export_model, resolve_dims


@cli.group("zoo")
def zoo() -> None:
    """The model zoo: the paper's workloads (+ BERT-base, GPT-2 small) as ONNX.

    Any command that takes a MODEL also accepts a zoo name (e.g. `autotm inspect resnet50`).
    """


def _rows() -> list[dict[str, object]]:

    return [{"name": e.name, "params": count_params(build_model(e.name)),
             "published_params": e.published_params, "default_dims": dict(e.default_dims),
             "other_dims": e.other_dims, "description": e.description}
            for e in ZOO.values()]


def _millions(count: object) -> str:
    return f"{count / 1e6:.1f}M" if isinstance(count, int) else "-"


@zoo.command("list")
@json_option
def list_models(as_json: bool) -> None:
    """Name, parameter count, default dims and description of every zoo model."""
    rows = _rows()
    if as_json:
        print_json(rows)
        return
    table = [("name", "params", "published", "default dims", "description")]
    table += [(str(r["name"]), _millions(r["params"]), _millions(r["published_params"]),
               " ".join(f"{k}={v}" for k, v in r["default_dims"].items()),  # type: ignore[union-attr]
               str(r["description"])) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    for row in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False))
                   + "  " + row[4])


@zoo.command("export")
@click.argument("name")
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False),
              help="The .onnx file to write; weights go to <stem>.weights.bin beside it.")
@click.option("--batch", "-b", type=int, default=None,
              help="Default batch size stored in the file (dims stay symbolic).")
@click.option("--seq-len", type=int, default=None,
              help="Default sequence length (sequence models only).")
@click.option("--with-weights", is_flag=True,
              help="Also write seeded random weights (large: 4 bytes per parameter).")
@json_option
def export(name: str, output: str, batch: int | None, seq_len: int | None,
           with_weights: bool, as_json: bool) -> None:
    """Write zoo model NAME as ONNX (weights as external data, written only if asked).

    Without --with-weights the file is for autotm (it reads shapes only): onnx.load,
    onnxruntime and Netron need the weights file beside it."""

    check_writable(output, "-o")
    path = export_model(name, output, batch=batch, seq_len=seq_len, with_weights=with_weights)
    weights = path.parent / f"{path.stem}.weights.bin"
    info = {"model": name, "path": str(path), "bytes": path.stat().st_size,
            "weights": str(weights) if with_weights else None,
            "loadable_by_other_tools": with_weights,
            "default_dims": resolve_dims(name, batch=batch, seq_len=seq_len)}
    if as_json:
        print_json(info)
        return
    dims = " ".join(f"{k}={v}" for k, v in info["default_dims"].items())
    click.echo(f"wrote {path} ({info['bytes']:,} bytes; default dims {dims})")
    click.echo(f"weights: {weights}" if with_weights else
               f"weights not written: autotm reads {path.name} as it is, but onnx.load, "
               f"onnxruntime and Netron cannot open it without {weights.name} (add "
               "--with-weights to write it, 4 bytes per parameter)")

