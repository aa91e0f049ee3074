"""A state directory that cannot be used is one line naming it, whichever command finds out; a
crash still reports itself when its log cannot be written; two crashes keep two logs.

Tests run as root, which file modes do not stop, so a state directory that cannot be written is
made with the immutable attribute (`chattr +i`), which the kernel enforces for root too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from orchestrator.__main__ import cli
from orchestrator.console import handle_errors


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture
def read_only_state(state: Path) -> Iterator[Path]:
    """An empty state directory no user may write in, root included."""
    state.mkdir()
    if shutil.which("chattr") is None:
        pytest.skip("no chattr here")
    made = subprocess.run(["chattr", "+i", str(state)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"chattr +i is not supported here: {made.stderr.strip()}")
    yield state
    subprocess.run(["chattr", "-i", str(state)], check=True)


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    # Port 1 of this machine: should a deploy get as far as connecting, it is refused at once.
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 127.0.0.1, ansible_port: 1}\n")
    return inv


@click.command()
@handle_errors
def crashes() -> None:
    """A command with a bug, as any of ours could have."""
    raise RuntimeError("boom")


def one_state_dir_line(done: Result, state: Path) -> None:
    assert done.exit_code == 2, done.output
    assert done.output.count("\n") == 1 and "Traceback" not in done.output, done.output
    assert done.output.startswith(f"error: state directory {state} (ORCHESTRATOR_STATE_DIR) "), done.output
    assert done.output.endswith("point ORCHESTRATOR_STATE_DIR at a writable directory\n"), done.output


@pytest.mark.parametrize("args", [["history"], ["results"], ["deploy", "-p", "cg_5tok"]])
def test_a_state_directory_that_is_a_file_is_one_line_naming_it(
    state: Path, inventory: Path, args: list[str]
) -> None:
    state.write_text("")
    if args[0] == "deploy":  # fails where the runner makes its run folder, before any play
        args = [*args, "-i", str(inventory)]
    one_state_dir_line(CliRunner().invoke(cli, args), state)


def test_a_state_directory_under_a_file_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "file" / "state"))
    done = CliRunner().invoke(cli, ["history"])
    one_state_dir_line(done, tmp_path / "file" / "state")
    assert f"lies under a file ({tmp_path / 'file'})" in done.output


def test_a_read_only_state_directory_stops_a_deploy_with_one_line(
    read_only_state: Path, inventory: Path
) -> None:
    done = CliRunner().invoke(cli, ["deploy", "-p", "cg_5tok", "-i", str(inventory)])
    one_state_dir_line(done, read_only_state)
    assert f"cannot be used (Operation not permitted: {read_only_state / 'runs'})" in done.output


def test_a_crash_is_saved_to_a_private_log_and_named(state: Path) -> None:
    done = CliRunner().invoke(crashes)
    assert done.exit_code == 1
    assert done.output.startswith("internal error: RuntimeError('boom'); traceback saved to ")
    log = Path(done.output.strip().rsplit(" ", 1)[1])
    assert log.parent == state / "crash" and log.stat().st_mode & 0o777 == 0o600
    assert "Traceback (most recent call last)" in log.read_text() and "RuntimeError: boom" in log.read_text()


def test_a_crash_whose_log_cannot_be_written_still_reports_itself(state: Path) -> None:
    state.write_text("")
    done = CliRunner().invoke(crashes)
    assert done.exit_code == 1 and isinstance(done.exception, SystemExit)
    first, *rest = done.output.splitlines()
    assert first.startswith("internal error: RuntimeError('boom'); the crash log could not be written (")
    assert f"{state / 'crash'}" in first and first.endswith("so here is the traceback:")
    assert rest[0] == "Traceback (most recent call last):" and rest[-1] == "RuntimeError: boom"


def test_a_crash_in_a_read_only_state_directory_still_reports_itself(read_only_state: Path) -> None:
    done = CliRunner().invoke(crashes)
    assert done.exit_code == 1 and isinstance(done.exception, SystemExit)
    assert "the crash log could not be written" in done.output and "RuntimeError: boom" in done.output


def test_two_crashes_in_one_second_keep_two_logs(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "strftime", lambda fmt, *t: "20260101-120000")  # one second, held
    outputs = [CliRunner().invoke(crashes).output for _ in range(3)]
    logs = sorted((state / "crash").iterdir())
    assert len(logs) == 3 and len({o.rsplit(" ", 1)[1] for o in outputs}) == 3
    assert all(log.name.startswith(f"20260101-120000-{os.getpid()}") for log in logs)
    assert all("RuntimeError: boom" in log.read_text() for log in logs)
