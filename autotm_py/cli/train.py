"""`autotm train`: train an ONNX file's own weights on arrays under a memory plan, and write the
trained model (docs/training-loop.md, "Training an ONNX file")."""

from __future__ import annotations

import click

from autotm_py.cli import cli
from autotm_py.cli.common import (
    RunModeArgs,
    check_writable,
    gpu_option,
    json_option,
    parse_dims,
    print_json,
    require,
    run_mode_options,
)
from autotm_py.cli.optimize import RATIO_HELP
from autotm_py.config import PlanConfig
from autotm_py.ir import LOSSES, Optimizer
from autotm_py.options import AUTO_PRECISION, PRECISION_CHOICES, default_run_mode
from autotm_py.units import format_bytes, parse_bytes, parse_ratio


@cli.command("train")
@click.argument("model")
@click.option("--data", required=True, type=click.Path(dir_okay=False),
              help="An .npz file: one array per model input, under its name, and the labels "
                   "under 'labels', samples on the first axis.")
@click.option("--steps", type=click.IntRange(min=1), required=True, help="Training steps.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Write the trained model here (ONNX: the file with its weights replaced).")
@click.option("--batch", "-b", type=int, default=None,
              help="Batch size (the model inputs' first dimension) [default: the file's].")
@click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE",
              help="Bind a symbolic dimension (repeatable).")
@click.option("--ratio", default=None, metavar="F:S", help=RATIO_HELP)
@click.option("--fast-mem", default=None, metavar="BYTES",
              help="Absolute fast-tier budget instead of --ratio, e.g. 16GiB.")
@click.option("--optimizer", type=click.Choice(["sgd", "adam", "adamw"]), default="sgd",
              show_default=True)
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=0.01,
              show_default=True, help="Learning rate.")
@click.option("--momentum", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="SGD momentum.")
@click.option("--weight-decay", type=click.FloatRange(min=0), default=0.0, show_default=True)
@click.option("--loss", type=click.Choice(LOSSES), default="auto", show_default=True,
              help="As `optimize --loss` (docs/training.md).")
@click.option("--device", default="cuda", show_default=True,
              help="cuda (or cuda:N) or cpu (the same plan, run on the CPU).")
@click.option("--precision", type=click.Choice(PRECISION_CHOICES), default=AUTO_PRECISION,
              show_default=True,
              help="fp32, or bf16 as torch.autocast(bfloat16) runs it (fp32 weights and "
                   "optimizer state; the trained file keeps its fp32 weights); auto: the "
                   "device's default (bf16 on a GPU with bf16 arithmetic, fp32 on the CPU). "
                   "See docs/precision.md.")
@run_mode_options(scratch=False)
@gpu_option
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the random values of weights the file has no data for.")
@click.option("--plans", "plans_dir", type=click.Path(file_okay=False), default=None,
              help="Where plans are kept between runs [default: beside the profile cache].")
@json_option
def train_cmd(model: str, data: str, steps: int, output: str, batch: int | None,
              dims: tuple[str, ...], ratio: str | None, fast_mem: str | None, optimizer: str,
              lr: float, momentum: float, weight_decay: float, loss: str, device: str,
              precision: str, mode: RunModeArgs, gpu: str | None, seed: int,
              plans_dir: str | None, as_json: bool) -> None:
    """Train the weights of MODEL (an ONNX file) on the arrays of --data for --steps steps under
    a fast-memory budget, and write the trained model to -o.

    The model starts from its own initializers; each step takes the next batch of the arrays
    (in order, the last partial batch dropped, from the start again when they run out). On a
    GPU the plan is made as `optimize` makes it by default (async, recompute on) and runs at
    planned addresses, replayed as a CUDA graph, unless told otherwise (--no-arena,
    --no-replay, ...).
    """
    require("torch", "autotm train")
    check_writable(output, "-o")
    from autotm_py.trainer import train_file

    config = PlanConfig(ratio=parse_ratio(ratio) if ratio else None,
                        fast_mem_bytes=parse_bytes(fast_mem) if fast_mem else None, gpu=gpu,
                        # as `optimize` plans by default
                        split_conv_grads="auto", update_order="auto")
    spec = Optimizer(optimizer, lr=lr, momentum=momentum, weight_decay=weight_decay)
    given = mode.over(default_run_mode(device)) if mode.given else None
    result = train_file(model, data, steps=steps, optimizer=spec, config=config,
                        output=output, loss=loss, batch=batch, dims=parse_dims(dims),
                        device=device, mode=given, seed=seed, plans_dir=plans_dir,
                        precision=precision)
    if as_json:
        print_json({"losses": list(result.losses), "output": str(result.output),
                    "batch": result.batch, "precision": result.precision,
                    "notes": list(result.notes),
                    "moves": result.moves, "recomputes": result.recomputes})
        return
    first, last = result.losses[0], result.losses[-1]
    click.echo(f"trained {model}: {steps} steps of batch {result.batch}, loss {first:.4f} -> "
               f"{last:.4f}; the plan moves {result.moves} and recomputes "
               f"{result.recomputes} tensors")
    for note in result.notes:
        click.echo(f"note: {note}")
    click.echo(f"wrote {output} ({format_bytes(result.output.stat().st_size)})")
