"""A state directory that cannot be used is one line naming it, whichever command finds out; a
crash is one line, its log saved in the state directory, else in the temporary directory, else
skipped with a note, and never a second traceback; two crashes keep two logs.

Tests run as root, which file modes do not stop, so a state directory that cannot be written is
made with the immutable attribute (`chattr +i`), which the kernel enforces for root too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from orchestrator.cli.console import handle_errors
from orchestrator.cli.main import cli


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
    assert "cannot be written (unable to open database file)" in done.output  # the ledger's check, first


def test_a_crash_is_saved_to_a_private_log_and_named(state: Path) -> None:
    done = CliRunner().invoke(crashes)
    assert done.exit_code == 1
    assert done.output.startswith("internal error: RuntimeError('boom'); traceback saved to ")
    log = Path(done.output.strip().rsplit(" ", 1)[1])
    assert log.parent == state / "crash" and log.stat().st_mode & 0o777 == 0o600
    assert "Traceback (most recent call last)" in log.read_text() and "RuntimeError: boom" in log.read_text()


def spare_log(done: Result, why: str) -> Path:
    """The one line of a crash whose log went to the temporary directory, and that log."""
    assert done.exit_code == 1 and isinstance(done.exception, SystemExit)
    assert done.output.count("\n") == 1 and "Traceback" not in done.output, done.output
    start = "internal error: RuntimeError('boom'); traceback saved to "
    assert done.output.startswith(start) and done.output.endswith(f" (not in the state directory: {why})\n")
    log = Path(done.output.removeprefix(start).split(" ", 1)[0])
    assert log.parent == Path(tempfile.gettempdir()) and log.name.startswith("orchestrator-crash-")
    assert log.stat().st_mode & 0o777 == 0o600 and "RuntimeError: boom" in log.read_text()
    log.unlink()
    return log


def test_a_crash_whose_state_directory_is_a_file_saves_its_log_in_the_temporary_directory(
    state: Path,
) -> None:
    state.write_text("")
    spare_log(CliRunner().invoke(crashes), f"Not a directory: {state / 'crash'}")


def test_a_crash_whose_crash_folder_is_a_file_saves_its_log_in_the_temporary_directory(state: Path) -> None:
    state.mkdir()
    (state / "crash").write_text("")
    spare_log(CliRunner().invoke(crashes), f"File exists: {state / 'crash'}")


def test_a_crash_in_a_read_only_state_directory_saves_its_log_in_the_temporary_directory(
    read_only_state: Path,
) -> None:
    spare_log(CliRunner().invoke(crashes), f"Operation not permitted: {read_only_state / 'crash'}")


def test_a_crash_with_nowhere_to_write_its_log_is_one_line_saying_so(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state.write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-tmp"))
    done = CliRunner().invoke(crashes)
    assert done.exit_code == 1 and isinstance(done.exception, SystemExit)
    assert done.output == (
        f"internal error: RuntimeError('boom'); no crash log written (Not a directory: {state / 'crash'}; "
        f"nor in {tmp_path / 'no-such-tmp'}: No such file or directory)\n"
    )
    assert done.output.count("\n") == 1 and "Traceback" not in done.output


def test_two_crashes_in_one_second_keep_two_logs(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "strftime", lambda fmt, *t: "20260101-120000")  # one second, held
    outputs = [CliRunner().invoke(crashes).output for _ in range(3)]
    logs = sorted((state / "crash").iterdir())
    assert len(logs) == 3 and len({o.rsplit(" ", 1)[1] for o in outputs}) == 3
    assert all(log.name.startswith(f"20260101-120000-{os.getpid()}") for log in logs)
    assert all("RuntimeError: boom" in log.read_text() for log in logs)


@pytest.mark.parametrize("args", [["history"], ["results"], ["deploy", "--check", "-p", "cg_5tok"]])
def test_a_state_directory_with_a_name_too_long_is_one_line(
    args: list[str], inventory: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An $XDG_STATE_HOME of 5,000 characters: ENAMETOOLONG was an internal error whose crash log
    could not be written either, so the user got two tracebacks."""
    monkeypatch.delenv("ORCHESTRATOR_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / ("x" * 5000)))
    done = CliRunner().invoke(cli, [*args, *(["-i", str(inventory)] if args[0] == "deploy" else [])])
    assert done.exit_code == 2, done.output
    assert done.output.count("\n") == 1 and "Traceback" not in done.output, done.output
    assert done.output.startswith(f"error: state directory {tmp_path}/xxx"), done.output
    assert "characters) ($XDG_STATE_HOME/orchestrator) cannot be used (File name too long" in done.output
    assert done.output.endswith("point ORCHESTRATOR_STATE_DIR at a writable directory\n")
    assert len(done.output) < 600


def test_a_state_directory_in_a_symlink_loop_is_one_line(
    tmp_path: Path, inventory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "loop" / "state"))
    done = CliRunner().invoke(cli, ["deploy", "--check", "-p", "cg_5tok", "-i", str(inventory)])
    one_state_dir_line(done, tmp_path / "loop" / "state")
    assert "cannot be used (Too many levels of symbolic links: " in done.output, done.output


def test_a_failure_before_the_command_runs_is_one_line(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An option's callback (here the one reading ansible.cfg for -K) runs before the command's
    own error handling: what it raises is still one line, never a traceback."""
    from orchestrator.hosts import ansible_config

    def broken() -> object:
        raise RuntimeError("boom")

    monkeypatch.setattr(ansible_config, "read", broken)
    done = CliRunner().invoke(cli, ["status", "-i", "/dev/null"])
    assert done.exit_code == 1 and isinstance(done.exception, SystemExit), done.output
    assert done.output.startswith("internal error: RuntimeError('boom'); traceback saved to "), done.output
    assert done.output.count("\n") == 1
