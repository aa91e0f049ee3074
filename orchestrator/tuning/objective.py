"""What a campaign optimises, in one place: the metric, its direction, its limits and its words.

Engine layer: never prints. `goal(space)` reads the space file's `objective`. Everything else
about "better" goes through the `Goal`:

- `gain(value, base)` puts a trial against the baseline so that higher is always better and 1 is
  the baseline: a speed-up for throughput, the baseline's latency over the trial's for latency.
- `adjust(metric, value, time_factor)` takes a host's speed out of a run: a host whose rounds take
  3% longer measures 3% less tok/s and 3% more latency.
- `feasible(...)` says whether a trial keeps the objective's limits (p99 TTFT at the scored level,
  a floor on throughput).
- `goodput(curve)` is the most load (requests/s, or concurrency) at which the p99 limits hold,
  read off the measured curve (as vLLM's `serve_sla` and GuideLLM's goodput do).
- `words(gain)` is how a verdict says it.

Three kinds of objective:
- maximize tok_s or total_tok_s at one level (the default: tok_s at the curve's first level);
- minimize p99_ttft_ms or p99_itl_ms at one level, with an optional floor on throughput;
- goodput: the load the p99 limits allow, over the whole curve.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

#: The ledger column of each objective's metric.
COLUMNS = {
    "tok_s": "tok_s",
    "total_tok_s": "total_tok_s",
    "p99_ttft_ms": "ttft_p99_s",
    "p99_itl_ms": "itl_p99_s",
}
#: What each metric is called in a sentence.
NAMES = {
    "tok_s": "tok/s of one request",
    "total_tok_s": "total tok/s",
    "ttft_p99_s": "p99 TTFT",
    "itl_p99_s": "p99 ITL",
}
#: Metrics that are times: lower is better, and a slow host measures more.
TIMES = ("ttft_p99_s", "itl_p99_s")


@dataclass(frozen=True)
class Goal:
    """The objective of one campaign."""

    kind: Literal["maximize", "minimize", "goodput"]
    #: the ledger column scored (goodput: the load itself, from the curve)
    metric: str
    #: index of the scored level in the traffic's levels (goodput: every level)
    level: int
    #: a trial over this p99 TTFT (seconds) at the scored level does not count
    ttft_max_s: float | None = None
    #: ledger column -> the least a trial must keep at the scored level
    floors: tuple[tuple[str, float], ...] = ()
    #: goodput's limits: ledger column -> seconds
    limits: tuple[tuple[str, float], ...] = ()

    @property
    def lower_is_better(self) -> bool:
        return self.kind == "minimize"

    @property
    def early_stop(self) -> bool:
        """Whether one run at the scored level can tell a trial is behind (not for goodput, which
        needs the whole curve)."""
        return self.kind != "goodput"

    @property
    def name(self) -> str:
        if self.kind == "goodput":
            return "goodput"
        return NAMES.get(self.metric, self.metric)

    def gain(self, value: float | None, base: float | None) -> float | None:
        """The trial against the baseline, higher better, 1 = the baseline."""
        return ratio(self.metric, value, base)

    def adjust(self, metric: str, value: float | None, time_factor: float) -> float | None:
        """A run's figure as an average host would measure it."""
        if value is None:
            return None
        return value / time_factor if metric in TIMES else value * time_factor

    def columns(self) -> list[str]:
        """The ledger columns this goal reads."""
        found = [self.metric] if self.kind != "goodput" else []
        found += [c for c, _ in self.limits] + [c for c, _ in self.floors]
        if self.ttft_max_s is not None:
            found.append("ttft_p99_s")
        return list(dict.fromkeys(found))

    def feasible(self, at_level: Mapping[str, float | None]) -> str:
        """'' when a trial's means at the scored level keep the limits, else why not."""
        ttft = at_level.get("ttft_p99_s")
        if self.ttft_max_s is not None and ttft is not None and ttft > self.ttft_max_s:
            return f"p99 TTFT {ttft * 1000:.0f} ms over {self.ttft_max_s * 1000:g} ms"
        for column, least in self.floors:
            value = at_level.get(column)
            if value is not None and value < least:
                return f"{NAMES[column]} {value:.1f} under the floor of {least:g}"
        return ""

    def goodput(self, curve: Sequence[tuple[float, Mapping[str, float | None]]]) -> float:
        """The most load whose p99 figures keep every limit, along a curve of (load, means).

        Between the last level that keeps them and the first that does not, the crossing is
        interpolated linearly. 0 when even the lowest level breaks a limit."""
        best = 0.0
        last: tuple[float, Mapping[str, float | None]] | None = None
        for x, means in sorted(curve, key=lambda c: c[0]):
            # a figure not measured at a level is not kept there
            broken = [(c, limit) for c, limit in self.limits if _or_inf(means.get(c)) > limit]
            if not broken:
                best, last = x, (x, means)
                continue
            if last is not None:
                x0, before = last
                cross = x
                for c, limit in broken:
                    y0, y1 = _or_inf(before.get(c)), _or_inf(means.get(c))
                    if math.isfinite(y1) and y1 > y0:
                        cross = min(cross, x0 + (x - x0) * (limit - y0) / (y1 - y0))
                best = max(best, cross)
            break
        return best

    def words(self, gain: float) -> str:
        """A gain as a verdict says it."""
        if self.kind == "goodput":
            return f"{gain:.2f}x the baseline's goodput"
        if self.lower_is_better:
            return f"{NAMES[self.metric]} {1 / gain:.2f}x the baseline's" if gain else NAMES[self.metric]
        return f"{gain:.2f}x"

    def describe(self, level_label: str) -> str:
        """The objective in one phrase, for --check and the docs."""
        if self.kind == "goodput":
            limits = " and ".join(f"{NAMES[c]} under {v * 1000:g} ms" for c, v in self.limits)
            return f"goodput: the most load with {limits}"
        verb = "minimize" if self.lower_is_better else "maximize"
        extra = [f"{NAMES[c]} at least {v:g}" for c, v in self.floors]
        if self.ttft_max_s is not None:
            extra.append(f"p99 TTFT under {self.ttft_max_s * 1000:g} ms")
        return f"{verb} {NAMES[self.metric]} at {level_label}" + (f" ({', '.join(extra)})" if extra else "")


def goal(objective: Any, level: int) -> Goal:
    """The Goal of a space file's `objective` (space.Objective), scored at level index `level`."""
    floors = tuple(
        (column, float(value))
        for column, value in (("tok_s", objective.tok_s_min), ("total_tok_s", objective.total_tok_s_min))
        if value is not None
    )
    ttft_max = None if objective.p99_ttft_ms_max is None else float(objective.p99_ttft_ms_max) / 1000
    if objective.goodput is not None:
        g = objective.goodput
        limits = tuple(
            (COLUMNS[name], float(ms) / 1000)
            for name, ms in (("p99_ttft_ms", g.p99_ttft_ms), ("p99_itl_ms", g.p99_itl_ms))
            if ms is not None
        )
        return Goal("goodput", "goodput", level, ttft_max, floors, limits)
    if objective.minimize is not None:
        return Goal("minimize", COLUMNS[objective.minimize], level, ttft_max, floors)
    return Goal("maximize", COLUMNS[objective.maximize or "tok_s"], level, ttft_max, floors)


def _or_inf(value: float | None) -> float:
    return math.inf if value is None else value


def ratio(column: str, value: float | None, base: float | None) -> float | None:
    """A figure against the baseline's, higher better: value / base, or base / value for a time."""
    if value is None or base is None:
        return None
    if column in TIMES:
        return base / value if value > 0 else None
    return value / base if base > 0 else None
