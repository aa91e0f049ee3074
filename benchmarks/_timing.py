"""What the benchmark scripts share: timing a whole command as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


def timed(argv: list[str], env: dict[str, str] | None = None, cwd: str | None = None) -> float:
    """Seconds the command took; a failing command ends the benchmark with its output."""
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd)
    took = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(
            f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    return took


@dataclass(frozen=True)
class Measured:
    wall_s: float
    cpu_s: float
    """User + system CPU seconds of the command and of every process under it that was waited for
    (os.wait4's rusage of the reaped child): a daemon it left running is not in it."""


def timed_cpu(
    argv: list[str], env: dict[str, str] | None = None, while_running: Callable[[int], None] | None = None
) -> Measured:
    """Wall and CPU seconds of the command; a failing command ends the benchmark with its output.

    `while_running(pid)` is called every 0.1 s from a thread until the command has ended. Output goes
    to files, not pipes, so a command that prints a lot never waits on a reader while we wait on it.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        ended = threading.Event()
        watcher = threading.Thread(target=_watch, args=(proc.pid, ended, while_running), daemon=True)
        if while_running:
            watcher.start()
        _, status, usage = os.wait4(proc.pid, 0)
        took = time.monotonic() - start
        ended.set()
        if while_running:
            watcher.join()
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        if proc.returncode != 0:
            out.seek(0)
            err.seek(0)
            sys.exit(
                f"{' '.join(argv)} failed ({proc.returncode}):\n"
                f"{out.read()[-2000:].decode(errors='replace')}\n{err.read()[-2000:].decode(errors='replace')}"
            )
    return Measured(took, usage.ru_utime + usage.ru_stime)


def _watch(pid: int, ended: threading.Event, call: Callable[[int], None] | None) -> None:
    while call and not ended.wait(0.1):
        call(pid)
