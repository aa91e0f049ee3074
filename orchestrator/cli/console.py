"""Where the CLI prints, and how expected errors become messages and exit codes.

It also holds what several commands share: their common options, the inventory a command uses
(inventory_or_lab brings the lab up when none is given), and checks such as check_plot_folder.
The command modules import it, never each other, so each loads alone when its command runs.
"""

from __future__ import annotations

import errno
import functools
import itertools
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.text import Text

from orchestrator.errors import (
    InputError,
    OrchestratorError,
    ProfileError,
    StateError,
    one_line,
    short_path,
    state_dir_error,
)
from orchestrator.paths import state_dir

# Piped output (CI logs, `| less`) gets wide tables rather than rich's 80-column default. Neither
# console reads markup or emoji codes in a string: most of what they print is a profile's, a
# ledger row's or a host's text, where `[/bold]` or `:x:` is data. Style comes from Text objects.
out = Console(highlight=False, markup=False, emoji=False, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False, markup=False, emoji=False, soft_wrap=True)


def shown(value: object, keep: str = "") -> str:
    """Text a user, a ledger row or a host supplied, as it may be printed: control characters
    escaped (errors.one_line: ESC is `\\x1b`, é stays é), so it can never drive the terminal. Every
    command prints such text through this, in tables and in plain lines alike; `keep="\\n"` for a
    text printed as several lines."""
    return one_line(str(value), keep)


def plain(value: object, style: str = "", keep: str = "") -> Text:
    """`shown(value)` as a rich Text, for a table cell or a styled line: never read as markup."""
    return Text(shown(value, keep), style=style)


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Expected errors become a message and their exit code; anything else a saved traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ProfileError as exc:
            for problem in exc.problems:
                err.print(str(problem))
            sys.exit(exc.exit_code)
        except OrchestratorError as exc:
            err.print(f"error: {shown(exc)}")
            sys.exit(exc.exit_code)
        except (click.exceptions.Exit, click.ClickException, SystemExit, KeyboardInterrupt):
            raise
        except Exception as exc:
            state_error = state_dir_problem(exc)
            if state_error is not None:
                err.print(f"error: {shown(state_error)}")
                sys.exit(state_error.exit_code)
            report_crash(exc)
            sys.exit(1)
        finally:
            _ledger_notes()

    return wrapper


def _ledger_notes() -> None:
    """The ledger rows this command skipped because they cannot be read (edited by hand: text in a
    number column), one note each, whatever read them: history, results, a bench's baseline line,
    a sweep, a rollback's choice of unit."""
    ledger = sys.modules.get("orchestrator.ledger")  # never loaded: nothing was read
    for note in ledger.take_unreadable() if ledger is not None else []:
        err.print(f"note: {shown(note)}", style="yellow")


#: What an OSError on a path says about the state directory rather than about the code: it cannot
#: be created, written or filled, or its name is too long or a symlink loop. ENOENT is not here: a
#: file missing under a usable directory is a bug.
_UNUSABLE = {
    errno.EACCES,
    errno.EPERM,
    errno.EROFS,
    errno.ENOTDIR,
    errno.EEXIST,
    errno.ENOSPC,
    errno.EDQUOT,
    errno.ENAMETOOLONG,
    errno.ELOOP,
}


def state_dir_problem(exc: BaseException) -> StateError | None:
    """An OSError on the state directory (or a path in or above it) as one line naming it.

    Every module that keeps files there (runs, caches, the lab, crash logs) makes its folders as it
    needs them; catching the failure here gives every command the same line, wherever it happened.
    """
    if not isinstance(exc, OSError) or exc.errno not in _UNUSABLE:
        return None
    root = Path(os.path.abspath(state_dir()))
    for name in (exc.filename, exc.filename2):
        if not isinstance(name, (str, bytes, os.PathLike)):
            continue
        where = Path(os.path.abspath(os.fsdecode(name)))
        if where == root:
            return state_dir_error(f"cannot be used ({exc.strerror})")
        if root in where.parents or where in root.parents:
            return state_dir_error(f"cannot be used ({exc.strerror}: {short_path(where)})")
    return None


def report_crash(exc: BaseException) -> None:
    """One line: the error, and where its traceback was saved. The log goes under <state>/crash,
    else (a state directory that is a file, read-only, full or unnamed) to a new private file in
    the temporary directory, saying why; where neither can be written, the line says so and the
    traceback is not shown: the user is owed one line, never a second traceback."""
    text = "".join(traceback.format_exception(exc))
    summary = f"internal error: {shown(repr(exc))[:500]}"
    try:
        folder = state_dir() / "crash"
        path = _write_crash_log(text, folder)
    except (OSError, RuntimeError) as failed:  # RuntimeError: no home directory for the default
        why = _why(failed)
        try:
            path = _write_spare_crash_log(text)
        except OSError as also:
            spare = short_path(tempfile.gettempdir())
            err.print(f"{summary}; no crash log written ({why}; nor in {spare}: {also.strerror or also})")
            return
        err.print(f"{summary}; traceback saved to {path} (not in the state directory: {why})")
        return
    err.print(f"{summary}; traceback saved to {path}")


def _why(failed: BaseException) -> str:
    """An OSError as `strerror: path`, short, in one line."""
    if isinstance(failed, OSError) and failed.strerror:
        where = f": {short_path(failed.filename)}" if failed.filename is not None else ""
        return f"{failed.strerror}{where}"
    return shown(failed)


def _write_spare_crash_log(text: str) -> Path:
    """A new 0600 file in the temporary directory ($TMPDIR, else /tmp): mkstemp makes it with
    O_EXCL under a random name, so another user's file or symlink there cannot take it over."""
    fd, name = tempfile.mkstemp(prefix=f"orchestrator-crash-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".log")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return Path(name)


def _write_crash_log(text: str, folder: Path) -> Path:
    """A new file under `folder` (<state>/crash): the second's time and the pid name it, and O_EXCL
    with a counter keeps two crashes in one second (one process or two) from overwriting each other."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    for n in itertools.count(1):
        path = folder / (f"{stem}.log" if n == 1 else f"{stem}-{n}.log")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # a message may quote a secret
        except FileExistsError:
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        return path
    raise AssertionError("unreachable")


def inventory_option(default: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`-i/--inventory`; `default` says what the command uses without one."""
    return click.option(
        "-i",
        "--inventory",
        type=click.Path(exists=True, dir_okay=True, path_type=Path),
        help="Ansible inventory (YAML or INI). Default: ANSIBLE_INVENTORY or the inventory of "
        f"ansible.cfg, else {default}.",
    )


def limit_option(
    help_text: str = "Only hosts matching this Ansible pattern.",
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option("--limit", "-l", metavar="PATTERN", help=help_text)


def _unit_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """--unit: a name systemd takes for a unit file of ours (systemd_rules.unit_name_problems)."""
    from orchestrator.profile import systemd_rules

    problems = systemd_rules.unit_name_problems(value)
    if problems:
        raise click.BadParameter("; ".join(problems))
    return value


unit_option = click.option(
    "--unit",
    "unit_name",
    default="sglang.service",
    show_default=True,
    callback=_unit_name,
    help="The systemd unit of the server.",
)


def inventory_or_lab(path: Path | None) -> Path:
    """The inventory as Ansible picks it (checked: a broken file is bad input, exit 2, before any play),
    else the lab's, brought up when needed: what commands that deploy use."""
    chosen = _given_or_configured(path)
    if chosen is not None:
        return chosen
    from orchestrator.lab import nspawn

    _say_inventory(f"the lab's, {nspawn.lab_dir() / 'inventory.yml'}", NO_INVENTORY)
    return nspawn.up(progress=lambda line: err.print(shown(line), style="dim")).inventory


def inventory_or_running_lab(path: Path | None) -> Path:
    """The inventory as Ansible picks it, else the lab that is up: commands that only read or stop
    never bring one up just to find it empty."""
    chosen = _given_or_configured(path)
    if chosen is not None:
        return chosen
    from orchestrator.lab import nspawn

    _say_inventory(f"the lab's, {nspawn.lab_dir() / 'inventory.yml'}", NO_INVENTORY)
    seen = nspawn.status()
    if not seen.healthy or seen.inventory is None:
        raise InputError("no inventory given and no lab is up: pass -i INVENTORY")
    return seen.inventory


#: Why a command without an inventory uses the lab's.
NO_INVENTORY = "no -i, ANSIBLE_INVENTORY or inventory in ansible.cfg"


def _given_or_configured(path: Path | None) -> Path | None:
    """`-i`, else the inventory the user's Ansible configuration names (ANSIBLE_INVENTORY, `inventory =`
    in ansible.cfg), said on stderr as the command's first line; checked (a broken file is bad input,
    exit 2, before any play). None: neither, so the lab's."""
    from orchestrator.hosts import ansible_config, inventory

    if path is None:
        found = ansible_config.read().inventory_source()
        if found is None:
            return None
        path, why = found
        _say_inventory(str(path), f"from {why}")
        if not path.exists():
            raise InputError(f"inventory {path} ({why}) does not exist")
    inventory.check(path)
    return path


def _say_inventory(which: str, why: str) -> None:
    err.print(f"inventory: {shown(which)} ({why})", style="dim")


def check_plot_folder(plot: Path) -> None:
    """--plot, checked before anything runs or prints (results, tune): matplotlib is there, the
    name says a format it writes, the folder exists, and the name is a file or nothing yet."""
    import importlib.util
    import stat

    from orchestrator.tuning.plot import FORMATS, plot_format

    if importlib.util.find_spec("matplotlib") is None:  # an extra
        raise InputError(
            "--plot draws with matplotlib, which is not installed: pip install 'orchestrator[plot]' "
            "(under pipx: pipx inject orchestrator matplotlib)"
        )
    if plot_format(plot) is None:
        raise InputError(
            f"--plot {shown(plot)}: name a {', '.join('.' + f for f in FORMATS)} file: the suffix "
            "says the format"
        )
    try:
        there = plot.parent.is_dir()
        mode = plot.stat().st_mode if plot.exists() or plot.is_symlink() else None
    except OSError as exc:  # a name over 255 bytes, a link to nowhere
        raise InputError(f"--plot {shown(plot)}: {exc.strerror or exc}") from None
    if not there:
        raise InputError(f"--plot {shown(plot)}: no folder {shown(plot.parent)} to write it in")
    if mode is not None and not stat.S_ISREG(mode):
        raise InputError(f"--plot {shown(plot)}: not a regular file (a folder, a FIFO, a device)")
