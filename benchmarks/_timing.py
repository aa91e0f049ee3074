"""What the benchmark scripts share: timing a whole command as a user runs it."""

from __future__ import annotations

import subprocess
import sys
import time


def timed(argv: list[str]) -> float:
    """Seconds the command took; a failing command ends the benchmark with its output."""
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True)
    took = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(
            f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    return took
