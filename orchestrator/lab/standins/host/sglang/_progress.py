"""tqdm's progress bars as SGLang's start-up draws them on stderr, and the stall knob's endless wait.

A bar is redrawn with `\\r` (tqdm on a file that is not a terminal), at most every 0.1 s as
tqdm's mininterval allows, and ends with `\\n` when done. The figures drawn (elapsed, rate) are
the planned ones, so a test can read them without timing anything.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

#: SGLang's weight loaders (model_loader/weight_utils.py `_BAR_FORMAT`).
SHARDS = "{desc}: {pct:3.0f}% Completed | {n}/{total} [{elapsed}<{remaining}, {rate}]"
#: tqdm's default layout, with its 10-column bar when the width is unknown (no terminal).
DEFAULT = "{desc}: {pct:3.0f}%|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}]"
_BLOCKS = " ▏▎▍▌▋▊▉█"
_MININTERVAL_S = 0.1


def interval(seconds: float) -> str:
    """tqdm.format_interval: `MM:SS`, or `H:MM:SS` from an hour on."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def bar_cells(fraction: float, width: int = 10) -> str:
    """tqdm's Bar: full blocks, one partial block, then spaces."""
    steps = len(_BLOCKS) - 1
    full, part = divmod(int(fraction * width * steps), steps)
    if full >= width:
        return _BLOCKS[-1] * width
    return _BLOCKS[-1] * full + _BLOCKS[part] + " " * (width - full - 1)


def render(layout: str, desc: str, n: int, total: int, elapsed: float) -> str:
    """One bar line, as tqdm formats it (rate below 1 it/s turns into s/it)."""
    rate = n / elapsed if elapsed > 0 and n > 0 else None
    if rate is None:
        rate_text, remaining = "?it/s", "?"
    else:
        rate_text = f"{1 / rate:5.2f}s/it" if rate < 1 else f"{rate:5.2f}it/s"
        remaining = interval((total - n) / rate)
    fraction = n / total if total else 1.0
    return layout.format(
        desc=desc,
        pct=fraction * 100,
        bar=bar_cells(fraction),
        n=n,
        total=total,
        elapsed=interval(elapsed),
        remaining=remaining,
        rate=rate_text,
    )


def first(layout: str, desc: str, total: int) -> None:
    """The bar's first state (0 done), ended: what is left of a bar whose first step failed."""
    sys.stderr.write("\r" + render(layout, desc, 0, total, 0.0) + "\n")
    sys.stderr.flush()


def forever() -> None:
    """A phase that never ends: no more output, until killed (SIGTERM still exits)."""
    while True:
        time.sleep(3600)


def run(
    layout: str,
    desc: Callable[[int], str],
    total: int,
    seconds: float,
    stall: bool = False,
) -> None:
    """Draw a bar from 0 to `total` over `seconds`; `desc(n)` names the step at n.

    With `stall`, the bar stops about half-way: that line is ended with `\\n` (so the journal
    gets it) and the phase never finishes."""
    draws = max(2 if stall else 1, min(total, int(seconds / _MININTERVAL_S)))
    stop = max(1, total // 2) if stall else None
    for i in range(draws + 1):
        n = round(i * total / draws)
        elapsed = seconds * i / draws
        sys.stderr.write("\r" + render(layout, desc(n), n, total, elapsed))
        sys.stderr.flush()
        if stop is not None and n >= stop:
            sys.stderr.write("\n")
            sys.stderr.flush()
            forever()
        if i < draws:
            time.sleep(seconds / draws)
    sys.stderr.write("\n")
    sys.stderr.flush()
