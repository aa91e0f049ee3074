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
