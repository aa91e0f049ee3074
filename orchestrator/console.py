"""Where the CLI prints, and how expected errors become messages and exit codes.

Shared by every command module (`__main__`, `bench_cli`, `logs_cli`), which cannot import
`__main__` without importing each other.
"""

from __future__ import annotations

import errno
import functools
import itertools
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from orchestrator.errors import OrchestratorError, ProfileError, StateError, state_dir_error
from orchestrator.paths import state_dir

# Piped output (CI logs, `| less`) gets wide tables rather than rich's 80-column default.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Expected errors become a message and their exit code; anything else a saved traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ProfileError as exc:
            for problem in exc.problems:
                err.print(str(problem), markup=False)
            sys.exit(exc.exit_code)
        except OrchestratorError as exc:
            err.print(f"error: {exc}", markup=False)
            sys.exit(exc.exit_code)
        except (click.exceptions.Exit, click.ClickException, SystemExit, KeyboardInterrupt):
            raise
        except Exception as exc:
            problem = state_dir_problem(exc)
            if problem is not None:
                err.print(f"error: {problem}", markup=False)
                sys.exit(problem.exit_code)
            report_crash(exc)
            sys.exit(1)

    return wrapper


#: What an OSError on a path says about the state directory rather than about the code: it cannot
#: be created, written or filled. ENOENT is not here: a file missing under a usable directory is a bug.
_UNUSABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST, errno.ENOSPC, errno.EDQUOT}


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
        if where == root or root in where.parents or where in root.parents:
            return state_dir_error(f"cannot be used ({exc.strerror}: {where})")
    return None


def report_crash(exc: BaseException) -> None:
    """Save the traceback to a crash log and say where; print it here when it cannot be saved
    (a state directory that is a file, read-only or full must not hide the original error)."""
    text = "".join(traceback.format_exception(exc))
    summary = f"internal error: {exc!r}"
    try:
        path = _write_crash_log(text)
    except OSError as failed:
        err.print(
            f"{summary}; the crash log could not be written ({failed}), so here is the traceback:",
            markup=False,
        )
        sys.stderr.write(text)
        return
    err.print(f"{summary}; traceback saved to {path}", markup=False)


def _write_crash_log(text: str) -> Path:
    """A new file under <state>/crash: the second's time and the pid name it, and O_EXCL with a
    counter keeps two crashes in one second (one process or two) from overwriting each other."""
    folder = state_dir() / "crash"
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
    from orchestrator import systemd_rules

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
    from orchestrator.lab import hosts as lab_hosts

    _say_inventory(f"the lab's, {lab_hosts.lab_dir() / 'inventory.yml'}", NO_INVENTORY)
    return lab_hosts.up(progress=lambda line: err.print(line, style="dim", markup=False)).inventory


def inventory_or_running_lab(path: Path | None) -> Path:
    """The inventory as Ansible picks it, else the lab that is up: commands that only read or stop
    never bring one up just to find it empty."""
    chosen = _given_or_configured(path)
    if chosen is not None:
        return chosen
    from orchestrator.errors import InputError
    from orchestrator.lab import hosts as lab_hosts

    _say_inventory(f"the lab's, {lab_hosts.lab_dir() / 'inventory.yml'}", NO_INVENTORY)
    seen = lab_hosts.status()
    if not seen.healthy or seen.inventory is None:
        raise InputError("no inventory given and no lab is up: pass -i INVENTORY")
    return seen.inventory


#: Why a command without an inventory uses the lab's.
NO_INVENTORY = "no -i, ANSIBLE_INVENTORY or inventory in ansible.cfg"


def _given_or_configured(path: Path | None) -> Path | None:
    """`-i`, else the inventory the user's Ansible configuration names (ANSIBLE_INVENTORY, `inventory =`
    in ansible.cfg), said on stderr as the command's first line; checked (a broken file is bad input,
    exit 2, before any play). None: neither, so the lab's."""
    from orchestrator import ansible_config, inventory
    from orchestrator.errors import InputError

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
    err.print(f"inventory: {which} ({why})", style="dim", markup=False)
