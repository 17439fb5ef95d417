"""The `autotm` command line: a thin layer over `autotm_py.api`.

One handler turns `AutoTMError` into ``error: <message>`` on stderr and its exit code; a
traceback is printed only with ``-v``. A module that is not installed (torch for profile, run
and calibrate; highspy; juliacall) is such an error too: one line naming the extra to install.
SIGTERM during a solve (`planning.control.Terminated`) exits 143 after the solver's cleanup.
Each command family lives in its own module and registers itself on `cli` when imported by
`_register_commands`.
"""

from __future__ import annotations

import importlib
import logging
import sys
import traceback
from collections.abc import Sequence

import click

from autotm_py.cli.help import TieredCommand
from autotm_py.errors import AutoTMError, MissingDependencyError
from autotm_py.planning import Terminated

COMMAND_MODULES = ("inspect", "zoo", "optimize", "device", "run", "train", "report",
                   "embeddings")


@click.group(
    name="autotm",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.option("-v", "--verbose", is_flag=True, help="Log details; print tracebacks on errors.")
@click.version_option(package_name="autotm_py", prog_name="autotm")
def cli(verbose: bool) -> None:
    """Plan where every tensor of a model lives (fast or slow memory) and when it moves.

    Typical use: `autotm optimize resnet50 --training --ratio 1:4 -o plan.json`.
    """
    handler = logging.StreamHandler()
    handler.setFormatter(OneLine(verbose))
    # (a no-op where the root logger has handlers already, as under pytest)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])


class OneLine(logging.Formatter):
    """A log record as the CLI's own messages look: ``warning: <first line>`` (with -v, every
    line, and ``info <logger>: ...`` for the details -v adds)."""

    def __init__(self, verbose: bool) -> None:
        super().__init__()
        self.verbose = verbose

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if not self.verbose:
            message = message.splitlines()[0] if message else ""
        level = record.levelname.lower()
        if record.levelno >= logging.WARNING:
            return f"{level}: {message}"
        return f"{level} {record.name}: {message}"


cli.command_class = TieredCommand  # --help lists the common options, --help-all every one


def _register_commands() -> None:
    for module in COMMAND_MODULES:
        try:
            importlib.import_module(f"autotm_py.cli.{module}")
        except ModuleNotFoundError as exc:
            if exc.name != f"autotm_py.cli.{module}":
                raise


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `autotm` script; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    _register_commands()
    verbose = "-v" in args or "--verbose" in args
    try:
        result = cli.main(args=args, prog_name="autotm", standalone_mode=False)
    except AutoTMError as exc:
        return _report(exc, exc.exit_code, verbose)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        print(f"error: {_click_message(exc)}", file=sys.stderr)
        return int(exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        print("interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("terminated: the solver was stopped and its files removed; nothing written",
              file=sys.stderr)
        return 143
    except ModuleNotFoundError as exc:  # an optional dependency that is not installed
        missing = MissingDependencyError((exc.name or "?").split(".")[0], _command(args))
        return _report(missing, missing.exit_code, verbose)
    return int(result) if isinstance(result, int) else 0


def _click_message(exc: click.ClickException) -> str:
    """Click's own errors (a bad option, a missing argument) in the CLI's one style: the
    message, then where to read the options."""
    message = " ".join(exc.format_message().split())
    ctx = getattr(exc, "ctx", None)
    if isinstance(exc, click.UsageError) and ctx is not None:
        message += f" (see {ctx.command_path} --help)"
    return message


def _command(args: Sequence[str]) -> str:
    """``autotm <command>`` for messages: the first argument that names a command."""
    name = next((a for a in args if a in cli.commands), None)
    return f"autotm {name}" if name else "autotm"


def _report(exc: BaseException, code: int, verbose: bool) -> int:
    if verbose:
        traceback.print_exc()
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    print(f"error: {message}", file=sys.stderr)
    return code
