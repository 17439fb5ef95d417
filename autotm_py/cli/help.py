"""Help that fits a screen: each command's `--help` lists its common options; the rest are
listed by `--help-all`, under "Advanced options".

Every command of the `autotm` group is a `TieredCommand` (the group's `command_class`). Its
common options are named in `COMMON`; a command not named there lists every option. `--help`
ends with one line that says how many options `--help-all` adds.
"""

from __future__ import annotations

from typing import Any

import click

# The options a newcomer needs, per command (parameter names, as click calls them). Everything
# else (solver knobs, run-mode overrides, profiling details) is advanced.
COMMON: dict[str, tuple[str, ...]] = {
    "optimize": ("batch", "dims", "training", "ratio", "fast_mem", "strategy", "device", "gpu",
                 "time_limit", "output", "as_json"),
    "simulate": ("plan_path", "gpu", "output", "as_json"),
    "run": ("plan_path", "device", "iterations", "random_weights", "output", "as_json"),
    "bench": ("models", "ratios", "strategies", "device", "gpu", "execute", "time_limit",
              "output", "as_json"),
    "report": ("plan_path", "out_dir", "simulate_plan", "model", "trace_path", "as_json"),
    "inspect": ("batch", "dims", "training", "loss_chunks", "gpu", "as_json"),
    "profile": ("batch", "dims", "training", "device", "as_json"),
    "train": ("data", "steps", "output", "batch", "ratio", "fast_mem", "optimizer", "lr",
              "device", "as_json"),
    "embeddings": ("budget", "alpha", "seed", "trace", "block_rows", "batch", "memory",
                   "as_json"),
}
HELP_ALL = "help_all"


def _show_everything(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    ctx.meta[HELP_ALL] = True
    click.echo(ctx.get_help(), color=ctx.color)
    ctx.exit()


class TieredCommand(click.Command):
    """A command whose `--help` shows its common options and whose `--help-all` shows all."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.append(click.Option(
            ["--help-all"], is_flag=True, expose_value=False, is_eager=True,
            callback=_show_everything, help="Show every option, the advanced ones too."))

    def common(self, param: click.Parameter) -> bool:
        names = COMMON.get(self.name or "")
        return names is None or param.name in names or param.name in ("help", "help_all")

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        common, advanced = [], []
        for param in self.get_params(ctx):
            record = None if isinstance(param, click.Argument) else param.get_help_record(ctx)
            if record is not None:
                (common if self.common(param) else advanced).append(record)
        with formatter.section("Options"):
            formatter.write_dl(common)
        if not advanced:
            return
        if ctx.meta.get(HELP_ALL):
            with formatter.section("Advanced options"):
                formatter.write_dl(advanced)
            return
        formatter.write_paragraph()
        formatter.write_text(f"{len(advanced)} more options: autotm {self.name} --help-all")
