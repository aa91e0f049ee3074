"""Where the CLI prints, and how expected errors become messages and exit codes.

Shared by every command module (`__main__`, `bench_cli`, `logs_cli`), which cannot import
`__main__` without importing each other.
"""

from __future__ import annotations

import functools
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from orchestrator.errors import OrchestratorError, ProfileError
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
        except Exception:
            path = state_dir() / "crash" / f"{time.strftime('%Y%m%d-%H%M%S')}.log"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(traceback.format_exc())
            err.print(f"internal error: {sys.exc_info()[1]!r}; traceback saved to {path}", markup=False)
            sys.exit(1)

    return wrapper


def inventory_option(default: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`-i/--inventory`; `default` says what the command uses without one."""
    return click.option(
        "-i",
        "--inventory",
        type=click.Path(exists=True, dir_okay=True, path_type=Path),
        help=f"Ansible inventory (YAML or INI). Default: {default}.",
    )


def limit_option(
    help_text: str = "Only hosts matching this Ansible pattern.",
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option("--limit", "-l", metavar="PATTERN", help=help_text)


unit_option = click.option(
    "--unit", "unit_name", default="sglang.service", show_default=True, help="The systemd unit of the server."
)


def inventory_or_lab(path: Path | None) -> Path:
    """The given inventory (checked: a broken file is bad input, exit 2, before any play), else the
    lab's, brought up when needed: what commands that deploy use."""
    if path is not None:
        from orchestrator import inventory

        inventory.check(path)
        return path
    from orchestrator.lab import hosts as lab_hosts

    return lab_hosts.up(progress=lambda line: err.print(line, style="dim", markup=False)).inventory


def inventory_or_running_lab(path: Path | None) -> Path:
    """The given inventory, else the lab that is up: commands that only read or stop never bring
    one up just to find it empty."""
    if path is not None:
        return inventory_or_lab(path)
    from orchestrator.errors import InputError
    from orchestrator.lab import hosts as lab_hosts

    seen = lab_hosts.status()
    if not seen.healthy or seen.inventory is None:
        raise InputError("no inventory given and no lab is up: pass -i INVENTORY")
    return seen.inventory
