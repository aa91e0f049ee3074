"""results --plot: tok/s against load, or tok/s per profile as bars.

Where the rows hold several loads, it draws one line per profile, with its 95% intervals. Otherwise
it draws tok/s per profile as bars spanning min..max over repeats, with accept length beside.

Engine layer: writes a PNG, SVG or PDF (the file's suffix says which), prints nothing. It returns
what it drew (bars, lines), so a test can check it. matplotlib's Agg backend draws without a
display (CI, ssh sessions).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.tuning.sweep import Curve, Entry

if TYPE_CHECKING:
    from matplotlib.axes import Axes


@dataclass(frozen=True)
class Bar:
    profile: str
    low: float
    high: float
    mean: float
    accept_len: float | None


#: what --plot writes, by the file's suffix
FORMATS = ("png", "svg", "pdf")


def plot_format(path: Path) -> str | None:
    """The format a plot file's suffix names (None: one we do not write)."""
    suffix = path.suffix.lower().lstrip(".")
    return suffix if suffix in FORMATS else None


def bars(entries: list[Entry]) -> list[Bar]:
    """One bar per profile (and level, where the entries hold several) that produced a number, in
    the entries' (ranked) order."""
    several = len({e.level for e in entries if e.level is not None}) > 1
    return [
        Bar(_name(e, several), min(e.tok_s), max(e.tok_s), e.mean or 0.0, e.accept_len)
        for e in entries
        if e.tok_s
    ]


def _name(e: Entry, several: bool) -> str:
    return f"{e.profile}\n{e.level.label()}" if several and e.level else e.profile


def plot(entries: list[Entry], baseline: str | None, path: Path, title: str = "") -> list[Bar]:
    """Draw the chart to `path` (its suffix names the format); failed profiles are named on the
    axis with 'failed'."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = bars(entries)
    failed = [_name(e, len({e.level for e in entries if e.level}) > 1) for e in entries if not e.tok_s]
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
        fig.savefig(path, format=plot_format(path) or "png")
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


#: Panels in one figure, one per workload (Level.workload): more is a filter to narrow.
MAX_PANELS = 6


@dataclass(frozen=True)
class Line:
    """One profile's curve as drawn: tok/s means at each load, with their 95% interval (None
    where a load had one run, drawn without an error bar)."""

    profile: str
    workload: str
    axis: str
    x: tuple[float, ...]
    mean: tuple[float, ...]
    low: tuple[float | None, ...]
    high: tuple[float | None, ...]
    baseline: bool


def spans_loads(curves: list[Curve]) -> bool:
    """Whether a curve has two loads or more: then tok/s against load says more than bars."""
    return any(len({e.level.x for e in c.entries if e.level}) > 1 for c in curves)


def lines(curves: list[Curve], baseline: str | None) -> list[Line]:
    """The curves as lines, leaving out loads a log axis cannot show (zero or less)."""
    drawn = []
    for c in curves:
        points = [(e.level.x, e.interval) for e in c.entries if e.level and e.level.x > 0 and e.interval]
        if not points:
            continue
        xs, found = zip(*points, strict=True)
        drawn.append(
            Line(
                c.profile,
                c.workload,
                c.axis,
                xs,
                tuple(i.mean for i in found),
                tuple(i.low for i in found),
                tuple(i.high for i in found),
                c.profile == baseline,
            )
        )
    return drawn


def plot_curves(curves: list[Curve], baseline: str | None, path: Path, title: str = "") -> list[Line]:
    """Draw tok/s against load to `path` (its suffix names the format): a panel per workload, a
    line per profile, error bars the 95% interval of the mean, the baseline dashed and named.
    Returns the lines drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from orchestrator.errors import InputError

    drawn = lines(curves, baseline)
    panels = list(dict.fromkeys((line.workload, line.axis) for line in drawn))
    if len(panels) > MAX_PANELS:
        raise InputError(
            f"--plot: these rows hold {len(panels)} workloads (endpoint, dataset, temperature, max "
            f"tokens), more than the {MAX_PANELS} one chart shows: narrow them with --endpoint, "
            "--dataset, --temperature"
        )
    fig, axes = plt.subplots(len(panels), 1, figsize=(8.0, 4.4 * len(panels)), dpi=120, squeeze=False)
    try:
        for ax, (workload, axis) in zip(axes[:, 0], panels, strict=True):
            _draw_lines(ax, [line for line in drawn if (line.workload, line.axis) == (workload, axis)])
            ax.set_title(title or f"decode tok/s against load: {workload}", fontsize="medium")
        fig.tight_layout()
        fig.savefig(path, format=plot_format(path) or "png")
    finally:
        plt.close(fig)
    return drawn


def _draw_lines(ax: Axes, drawn: list[Line]) -> None:
    """One panel: x on a log2 scale with a tick at each load, error bars where a load had repeats."""
    colors = iter(["#4c78a8", "#f58518", "#54a24b", "#b279a2", "#9d755d", "#72b7b2", "#eeca3b", "#ff9da6"])
    for line in drawn:
        color: str | None
        if line.baseline:
            color, linestyle, marker, label = "black", "--", "s", f"{line.profile} (baseline)"
        else:  # past the palette, None: matplotlib's own colour cycle
            color, linestyle, marker, label = next(colors, None), "-", "o", line.profile
        plotted = ax.plot(
            line.x, line.mean, linewidth=1.6, color=color, linestyle=linestyle, marker=marker, label=label
        )
        points = zip(line.x, line.mean, line.low, line.high, strict=True)
        bars = [(x, m, m - lo, hi - m) for x, m, lo, hi in points if lo is not None and hi is not None]
        if bars:
            xs, means, below, above = zip(*bars, strict=True)
            ax.errorbar(xs, means, yerr=[below, above], fmt="none", capsize=4, color=plotted[0].get_color())
    loads = sorted({x for line in drawn for x in line.x})
    ax.set_xscale("log", base=2)
    ax.set_xticks(loads, [f"{x:g}" for x in loads])
    ax.minorticks_off()
    ax.set_xlabel(drawn[0].axis if drawn else "load")
    ax.set_ylabel("decode tok/s per request (mean, 95% interval)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", framealpha=0.9)
