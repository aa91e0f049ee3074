"""A campaign's runs as figures: each trial's gain over the baseline, on one scale for every host.

Engine layer: never prints. tune.py's Campaign keeps one `Scores`. It reads the campaign's bench
runs (rows of the ledger) and says:

- the model fitted on them (surrogate.py), refitted when runs were added;
- each run's figure as the average host measures it (the fit's host factors taken out);
- a profile's mean figures per level, its gain over the baseline (objective.py says which way is
  better), and its gains run by run for Welch's test;
- the run-to-run noise, and the margin a first look must trail the best by to stop.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchestrator.tuning import objective as objective_mod
from orchestrator.tuning import search as search_mod
from orchestrator.tuning import space as space_mod
from orchestrator.tuning import surrogate
from orchestrator.tuning import sweep as sweep_mod

#: The least margin by which a first look must trail the best finished trial to stop it, and
#: how many run-to-run standard deviations it is otherwise.
MIN_MARGIN = 0.02
MARGIN_SIGMAS = 3.0


def load_of(level: sweep_mod.Level) -> float:
    """Where a level lies on its curve: its request rate, or its concurrency."""
    return float(level.request_rate) if level.request_rate is not None else float(level.concurrency)


class Scores:
    """What a campaign's runs say, for one space and objective."""

    def __init__(
        self,
        x: space_mod.Expanded,
        levels: list[sweep_mod.Level],
        goal: objective_mod.Goal,
        rows: Callable[[], list[Any]],
    ) -> None:
        self.x = x
        self.levels = levels
        self.level = levels[goal.level] if goal.kind != "goodput" else levels[0]
        self.goal = goal
        self.baseline = x.baseline
        self.rows = rows
        varied = list(x.space.vary)
        self.shapes = {p.key: surrogate.shape_of(p.profile, varied) for p in x.valid if p.profile}
        self.base_shape = surrogate.shape_of(self.baseline, varied)
        self.lock = threading.RLock()
        #: (the runs' ids, bootstrap refits) -> the fit on them
        self._fits: dict[tuple[tuple[Any, ...], int], surrogate.Fit | None] = {}
        self._fitting = threading.Lock()

    def point_of(self, profile: str) -> str | None:
        """The point key (or the baseline's own key) of a profile name."""
        if profile == self.baseline.name:
            return "baseline"
        p = self.by_name.get(profile)
        return p.key if p else None

    @property
    def by_name(self) -> dict[str, space_mod.Point]:
        return {p.name: p for p in self.x.valid}

    def observations(self, rows: Sequence[Any]) -> list[surrogate.Observation]:
        out = []
        for r in rows:
            if not sweep_mod.measured(r):
                continue
            key = self.point_of(r["profile"])
            level = sweep_mod.level_of(r)
            if key is None or level not in self.levels:
                continue
            shape = self.base_shape if key == "baseline" else self.shapes[key]
            out.append(
                surrogate.Observation(
                    key,
                    shape,
                    r["host"],
                    self.levels.index(level),
                    float(r["tok_s"]),
                    sweep_mod._level_accept(r),
                    r["total_tok_s"],
                    r["itl_p99_s"],
                    r["ttft_p99_s"],
                )
            )
        return out

    def fit(self, rows: Sequence[Any] | None = None, boots: int = 0) -> surrogate.Fit | None:
        """The model on the campaign's runs (None before any); without bootstrap refits unless asked.

        A fit is made once per set of runs: hosts that ask together wait for one fit and share it
        (a bootstrap fit takes about half a second, and Python's threads would only take turns)."""
        rows = self.rows() if rows is None else rows
        key = (tuple(_row_id(r) for r in rows), boots)
        with self._fitting:
            if key in self._fits:
                return self._fits[key]
            obs = self.observations(rows)
            found = None
            if obs:
                found = surrogate.fit(
                    obs,
                    len(self.levels),
                    seed=self.x.space.search.seed or 0,
                    boots=boots,
                    run_sigma=self.noise(rows, "tok_s"),  # the fit's figures are tok/s and accept lengths
                )
            self._fits = {k: v for k, v in self._fits.items() if k[1] != boots}  # the newest only
            self._fits[key] = found
            return found

    def noise(self, rows: Sequence[Any], column: str | None = None) -> float | None:
        """Run-to-run noise of a metric (the scored one by default) at the scored level, as a
        fraction: the pooled standard deviation of every point measured more than once on one host,
        each run against its group's mean (pooled over the groups' degrees of freedom, so two runs
        of a point weigh as one)."""
        column = column or (self.goal.metric if self.goal.kind != "goodput" else "tok_s")
        runs: dict[tuple[str, str], list[float]] = {}
        for r in rows:
            if sweep_mod.measured(r) and sweep_mod.level_of(r) == self.level and r[column] is not None:
                runs.setdefault((r["profile"], r["host"]), []).append(float(r[column]))
        squares, dof = 0.0, 0
        for v in runs.values():
            mean = statistics.fmean(v)
            if len(v) > 1 and mean:
                squares += sum((x / mean - 1.0) ** 2 for x in v)
                dof += len(v) - 1
        return (squares / dof) ** 0.5 if dof else None

    def runs(
        self,
        rows: Sequence[Any],
        profile: str,
        level: sweep_mod.Level,
        column: str,
        fit: surrogate.Fit | None,
    ) -> list[tuple[tuple[str, int], float]]:
        """A profile's runs at `level` as ((curve, repeat), figure on the average host): one key per
        pass over the curve, a leader's extra runs included."""
        out = []
        for r in rows:
            if r["profile"] != profile or not sweep_mod.measured(r) or sweep_mod.level_of(r) != level:
                continue
            factor = fit.host_time_factor(r["host"]) if fit else 1.0
            value = self.goal.adjust(column, r[column], factor)
            if value is not None:
                out.append(((str(r["curve_id"]), int(r["repeat"] or 0)), value))
        return out

    def means(
        self, rows: Sequence[Any], profile: str, fit: surrogate.Fit | None
    ) -> dict[tuple[int, str], float]:
        """A profile's mean figures (average host) per (level index, column)."""
        out = {}
        for i, level in enumerate(self.levels):
            for column in {*self.goal.columns(), "tok_s", "total_tok_s", "ttft_p99_s", "itl_p99_s"}:
                found = [v for _, v in self.runs(rows, profile, level, column, fit)]
                if found:
                    out[(i, column)] = statistics.fmean(found)
        return out

    def curve(self, means: Mapping[tuple[int, str], float]) -> list[tuple[float, dict[str, float | None]]]:
        return [
            (load_of(level), {c: means.get((i, c)) for c, _ in self.goal.limits})
            for i, level in enumerate(self.levels)
            if any((i, c) in means for c, _ in self.goal.limits)
        ]

    def base(self, rows: Sequence[Any], fit: surrogate.Fit | None) -> dict[tuple[int, str], float]:
        base = self.means(rows, self.baseline.name, fit)
        if self.goal.kind == "goodput" and base:
            base[(-1, "goodput")] = self.goal.goodput(self.curve(base))
        return base

    def samples(self, profile: str, rows: Sequence[Any] | None = None) -> list[float]:
        """A profile's gain run by run (goodput: repeat by repeat), each against the baseline's mean."""
        rows = self.rows() if rows is None else rows
        fit = self.fit(rows)
        base = self.base(rows, fit)
        goal = self.goal
        if goal.kind != "goodput":
            ref = base.get((goal.level, goal.metric))
            runs = self.runs(rows, profile, self.level, goal.metric, fit)
            return [g for _, v in runs if (g := goal.gain(v, ref)) is not None]
        ref = base.get((-1, "goodput"))
        by_repeat: dict[tuple[str, int], dict[tuple[int, str], float]] = {}
        for i, level in enumerate(self.levels):
            for c, _ in goal.limits:
                for k, v in self.runs(rows, profile, level, c, fit):
                    by_repeat.setdefault(k, {})[(i, c)] = v
        unit = ref or load_of(self.levels[0]) or 1.0
        return [goal.goodput(self.curve(m)) / unit for m in by_repeat.values()]

    def value(self, profile: str, rows: Sequence[Any] | None = None) -> float | None:
        """A profile's gain over the baseline: its mean figure against the baseline's (goodput: its
        curve's goodput against the baseline's). None before the baseline is measured."""
        rows = self.rows() if rows is None else rows
        fit = self.fit(rows)
        base = self.base(rows, fit)
        if not base:
            return None
        mine = self.means(rows, profile, fit)
        if self.goal.kind == "goodput":
            ref = base.get((-1, "goodput"))
            value = self.goal.goodput(self.curve(mine))
            return value / (ref or load_of(self.levels[0]) or 1.0) if mine else None
        return self.goal.gain(
            mine.get((self.goal.level, self.goal.metric)), base.get((self.goal.level, self.goal.metric))
        )

    def margin(self) -> float:
        noise = self.noise(self.rows())
        return max(MIN_MARGIN, MARGIN_SIGMAS * noise) if noise is not None else 0.05

    def context(
        self, rows: Sequence[Any], fit: surrogate.Fit, discrepancy: float = 0.0
    ) -> search_mod.Context:
        """What the search measures the model's predictions against; `discrepancy`: the model's own
        error so far on the trials it predicted."""
        return search_mod.Context(
            self.goal,
            [load_of(level) for level in self.levels],
            self.base_shape,
            self.base(rows, fit),
            self.noise(rows) or surrogate.RUN_SIGMA,
            discrepancy,
        )


def _row_id(r: Any) -> Any:
    """A run's ledger id (its figures where it has none: a row built by hand)."""
    try:
        return r["id"]
    except (IndexError, KeyError):
        return tuple(r.values()) if isinstance(r, dict) else tuple(r)
