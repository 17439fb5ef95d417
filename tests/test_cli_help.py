"""Every command's `--help` fits a screen (under 60 lines at 80 columns) and names
`--help-all`, which lists every option, the advanced ones under their own heading
(docs/user-guide.md, "Help")."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from autotm_py.cli import _register_commands, cli

_register_commands()
COMMANDS = sorted(name for name, c in cli.commands.items() if not isinstance(c, click.Group))


def helped(*args: str) -> str:
    result = CliRunner().invoke(cli, [*args], terminal_width=80)
    assert result.exit_code == 0, result.output
    return result.output


def flags(command: click.Command) -> set[str]:
    return {opt for p in command.params if isinstance(p, click.Option) and not p.hidden
            for opt in p.opts}


@pytest.mark.parametrize("name", COMMANDS)
def test_help_fits_a_screen_and_help_all_lists_every_option(name):
    short, full = helped(name, "--help"), helped(name, "--help-all")
    assert len(short.splitlines()) < 60, short
    listed = {f for f in flags(cli.commands[name]) if f in full}
    assert listed == flags(cli.commands[name])
    advanced = {f for f in flags(cli.commands[name]) if f not in short}
    if advanced:
        assert f"autotm {name} --help-all" in short
        assert "Advanced options:" in full
        tail = full.split("Advanced options:")[1]
        assert all(f in tail for f in advanced)


def test_the_group_help_fits_a_screen():
    assert len(helped("--help").splitlines()) < 60


def test_click_errors_are_one_error_line_that_says_where_the_options_are(capsys):
    from autotm_py.cli import main

    assert main(["optimize", "resnet50", "--bogus"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: No such option '--bogus'")
    assert err[0].endswith("(see autotm optimize --help)")
    assert main(["nosuch"]) == 2
    assert capsys.readouterr().err.startswith("error: No such command 'nosuch'.")


def test_log_warnings_are_one_formatted_line(tmp_path):
    """A warning from the library (here: kernels without a profile) prints as the CLI's own
    warnings do, not as a logger record."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "autotm_py", "optimize", "tests/fixtures/tiny_cnn_opset13.onnx",
         "--batch", "2", "--training", "--ratio", "1:1", "--device", "cpu", "--no-baselines",
         "--profiles", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert any(ln.startswith("warning: ") and "have no profile" in ln for ln in lines), lines
    assert not any(ln.startswith(("WARNING", "INFO")) for ln in lines), lines


def test_multi_second_steps_show_a_status_line_that_names_them(monkeypatch, capsys):
    """inspect, simulate and report draw the status line optimize draws (on a terminal, after
    `BUSY_DELAY_S`), naming the step; nothing for --json or a pipe."""
    import io
    import time

    from autotm_py.cli import status

    stream = io.StringIO()
    monkeypatch.setattr(status, "wanted", lambda as_json: not as_json)
    monkeypatch.setattr(status, "BUSY_DELAY_S", 0.0)
    with status.busy("loading the model", False, stream=stream) as control:
        time.sleep(0.3)
        control.report(stage="pricing the kernels")
        time.sleep(0.3)
    text = stream.getvalue()
    assert "autotm: loading the model, 0 s" in text and "autotm: pricing the kernels" in text
    assert text.endswith("\r\x1b[K")  # erased at the end
    quiet = io.StringIO()
    with status.busy("loading the model", True, stream=quiet):
        time.sleep(0.1)
    assert quiet.getvalue() == ""


def test_inspect_draws_its_steps(monkeypatch):
    from autotm_py.cli import status

    monkeypatch.setattr(status, "wanted", lambda as_json: not as_json)
    monkeypatch.setattr(status, "BUSY_DELAY_S", 0.0)
    result = CliRunner().invoke(cli, ["inspect", "resnet50", "--batch", "2", "--training"])
    assert result.exit_code == 0, result.output
    assert "autotm: loading the model" in result.stderr
    assert "peak live" in result.stdout and "autotm:" not in result.stdout
