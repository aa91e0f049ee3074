"""results --plot: tok/s per profile as bars spanning min..max over repeats, accept length beside.

Engine layer: writes a PNG, prints nothing; returns the bars it drew so a test can check them.
matplotlib's Agg backend draws without a display (CI, ssh sessions).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.sweep import Entry

if TYPE_CHECKING:
    from matplotlib.axes import Axes


@dataclass(frozen=True)
class Bar:
    profile: str
    low: float
    high: float
    mean: float
    accept_len: float | None


def bars(entries: list[Entry]) -> list[Bar]:
    """One bar per profile that produced a number, in the entries' (ranked) order."""
    return [
        Bar(e.profile, min(e.tok_s), max(e.tok_s), e.mean or 0.0, e.accept_len) for e in entries if e.tok_s
    ]


def plot(entries: list[Entry], baseline: str | None, path: Path, title: str = "") -> list[Bar]:
    """Draw the chart to `path` (PNG); failed profiles are named on the axis with 'failed'."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = bars(entries)
    failed = [e.profile for e in entries if not e.tok_s]
    labels = [b.profile for b in drawn] + [f"{name}\n(failed)" for name in failed]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.5 * len(labels) + 2), 4.8), dpi=120)
    try:
        _draw_speed(ax, drawn, entries, baseline)
        _draw_accept(ax, drawn)
        ax.set_xticks(range(len(labels)), labels)
        for tick in ax.get_xticklabels()[len(drawn) :]:
            tick.set_color("#e45756")
        ax.set_xlim(-0.6, max(len(labels), 1) - 0.4)
        ax.set_title(title or "decode speed per profile (bar: min..max over repeats, tick: mean)")
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return drawn


def _draw_speed(ax: Axes, drawn: list[Bar], entries: list[Entry], baseline: str | None) -> None:
    """Floating bars min..max; an axis that starts near the data so repeats' spread is visible."""
    lows = [b.low for b in drawn] or [0.0]
    highs = [b.high for b in drawn] or [1.0]
    bottom, top = max(0.0, 0.85 * min(lows)), 1.08 * max(highs)
    thin = (top - bottom) * 0.006  # one run: min == max still shows as a bar
    for x, b in enumerate(drawn):
        label = "tok/s, min..max" if x == 0 else "_bar"
        ax.bar(x, max(b.high - b.low, thin), bottom=b.low, width=0.5, color="#4c78a8", label=label)
        ax.hlines(b.mean, x - 0.28, x + 0.28, colors="black", linewidth=1.5, label="mean" if x == 0 else "_m")
        ax.annotate(f"{b.mean:.1f}", (x, b.high), textcoords="offset points", xytext=(0, 4), ha="center")
    base = next((e for e in entries if e.profile == baseline and e.tok_s), None)
    if base is not None and base.mean is not None:
        label = f"baseline {base.profile}: {base.mean:.1f} tok/s"
        ax.axhline(base.mean, color="#e45756", linestyle="--", linewidth=1.2, label=label)
    ax.set_ylim(bottom, top)
    ax.set_ylabel("decode tok/s per request")
    ax.grid(axis="y", alpha=0.3)


def _draw_accept(ax: Axes, drawn: list[Bar]) -> None:
    """Accept length on a second axis from 0 (1.0 is plain decoding)."""
    right = ax.twinx()
    # Beside each bar, not on it: the two scales must not be read against each other.
    points = [(x + 0.36, b.accept_len) for x, b in enumerate(drawn) if b.accept_len is not None]
    if points:
        xs, ys = zip(*points, strict=True)
        right.plot(xs, ys, "D", color="#f58518", label="accept length (right axis)")
        for x, y in points:
            right.annotate(
                f"{y:.2f}", (x, y), textcoords="offset points", xytext=(0, 7), ha="center", color="#f58518"
            )
    right.set_ylim(0, max([y for _, y in points] + [1.0]) * 1.3)
    right.set_ylabel("accept length (tokens per verify round)", color="#f58518")
    handles, labels = ax.get_legend_handles_labels()
    more, more_labels = right.get_legend_handles_labels()
    ax.legend(handles + more, labels + more_labels, loc="lower left", fontsize="small", framealpha=0.9)
