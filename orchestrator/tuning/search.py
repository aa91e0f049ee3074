"""Which point a campaign restarts into next: the model's choice, or the grid's, or chance's.

Engine layer: never prints. `Search.next(...)` returns the next point with the gain the model
predicted for it (None where no model chose it).

The `model` search (the default), from any start:
1. The space's own setting first, where the space holds it: the verdict then says whether
   anything beats what runs today.
2. Then points spread over the space (`startup_trials` in all, the first included): each the
   farthest from every point measured or in flight, in each field's rank order (a maximin
   design). A fit needs shapes that differ before it can tell steps from width.
3. Then the fitted model (surrogate.py) predicts every valid point's gain over the baseline with
   its bootstrap spread. The next restart goes where the expected improvement over the best
   measured gain is largest (Jones, Schonlau and Welch, 1998), times the chance that the point
   keeps the objective's limits. A point far from the measured ones has a wide spread, so it is
   tried when the best prediction is no better than what is known.

`grid` asks every valid point in the space's order; `random` draws them in a seeded order. Neither
looks at what a trial measured (the grid is the reference a benchmark compares against).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.tuning import objective as objective_mod
from orchestrator.tuning import space as space_mod
from orchestrator.tuning import surrogate


@dataclass(frozen=True)
class Guess:
    """The model's view of one point: its gain's mean and spread, and the chance it is feasible."""

    mean: float
    std: float
    feasible: float = 1.0

    def chance_above(self, bar: float) -> float:
        """The chance the point's gain is above `bar`."""
        if self.std <= 0:
            return self.feasible * float(self.mean > bar)
        return self.feasible * (1.0 - _phi((bar - self.mean) / self.std))


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _pdf(z: float) -> float:
    return math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


def expected_improvement(g: Guess, best: float) -> float:
    """EI of a normal belief over `best` (Jones et al. 1998), times the chance it is feasible."""
    if g.std <= 0:
        return g.feasible * max(0.0, g.mean - best)
    z = (g.mean - best) / g.std
    return g.feasible * ((g.mean - best) * _phi(z) + g.std * _pdf(z))


@dataclass
class Context:
    """What the model's predictions are measured against."""

    goal: objective_mod.Goal
    #: the traffic's loads, in level order (concurrency or request rate): goodput's curve
    loads: list[float]
    #: the baseline's shape, and its measured figures (average host) per (level, column)
    base_shape: surrogate.Shape
    base: dict[tuple[int, str], float]
    #: run-to-run noise of the scored metric, as a fraction
    noise: float = surrogate.RUN_SIGMA
    #: how far the model's form may be off, as a fraction of a gain, at the far side of the
    #: space from every measured point: its own error on the trials it predicted, at least
    #: DISCREPANCY
    discrepancy: float = 0.0


def _figure(one: Any, s: surrogate.Shape, level: int, column: str) -> float | None:
    return one.predict(s, level, column)


def _gain_of(one: Any, s: surrogate.Shape, ctx: Context) -> float | None:
    """One fit's gain of shape `s` over the baseline."""
    goal = ctx.goal
    if goal.kind == "goodput":

        def curve(shape: surrogate.Shape) -> list[tuple[float, dict[str, float | None]]]:
            return [
                (x, {c: _figure(one, shape, i, c) for c, _ in goal.limits}) for i, x in enumerate(ctx.loads)
            ]

        mine = goal.goodput(curve(s))
        base = goal.goodput(curve(ctx.base_shape)) if not ctx.base else ctx.base.get((-1, "goodput"))
        return mine / base if base else mine / (ctx.loads[0] or 1.0)
    value = _figure(one, s, goal.level, goal.metric)
    base = ctx.base.get((goal.level, goal.metric)) or _figure(one, ctx.base_shape, goal.level, goal.metric)
    return goal.gain(value, base)


def _feasible(fit: surrogate.Fit, s: surrogate.Shape, ctx: Context) -> float:
    """The chance a point keeps the goal's limits at the scored level, from the bootstrap."""
    goal = ctx.goal
    checks = [("ttft_p99_s", goal.ttft_max_s, True)] if goal.ttft_max_s is not None else []
    checks += [(c, least, False) for c, least in goal.floors]
    chance = 1.0
    for column, bound, upper in checks:
        p = fit.predict(s, goal.level, column)
        if p is None:
            continue
        spread = max(p.std, abs(p.mean) * ctx.noise)
        z = (bound - p.mean) / spread if spread else (math.inf if (p.mean <= bound) == upper else -math.inf)
        chance *= _phi(z) if upper else 1.0 - _phi(z)
    return chance


#: The least the model's form is assumed to be off, far from every measured point.
DISCREPANCY = 0.03


def guesses(
    fit: surrogate.Fit,
    shapes: Mapping[str, surrogate.Shape],
    ctx: Context,
    distance: Mapping[str, float] | None = None,
) -> dict[str, Guess]:
    """The model's gain of each point (key -> Guess): the main fit's mean; its spread is the
    bootstrap's (what the runs leave unknown) and the model's possible error, which grows with
    the point's `distance` (0..1) from the nearest measured point (a structure fitted on a few
    points is trusted near them, less far away)."""
    off = max(DISCREPANCY, ctx.discrepancy)
    out = {}
    for key, s in shapes.items():
        mean = _gain_of(fit.main, s, ctx)
        if mean is None:
            continue
        boots = [g for one in fit.boots if (g := _gain_of(one, s, ctx)) is not None]
        spread = statistics.pstdev(boots) if len(boots) > 1 else abs(mean)
        far = (distance or {}).get(key, 1.0)
        spread = math.hypot(spread, off * far * abs(mean))
        out[key] = Guess(mean, max(spread, ctx.noise * abs(mean)), _feasible(fit, s, ctx))
    return out


def _coords(point: space_mod.Point, ranks: Mapping[str, Callable[[Any], float]]) -> list[float]:
    return [ranks[k](v) for k, v in point.params.items()]


def _farthest(
    candidates: Sequence[space_mod.Point],
    chosen: Sequence[space_mod.Point],
    ranks: Mapping[str, Callable[[Any], float]],
) -> space_mod.Point:
    """The candidate farthest from every chosen point (maximin, in rank coordinates scaled to [0, 1];
    the first candidate in space order breaks ties)."""
    if not chosen:
        return candidates[len(candidates) // 2]
    taken = [_coords(p, ranks) for p in chosen]

    def distance(p: space_mod.Point) -> float:
        mine = _coords(p, ranks)
        return min(sum((a - b) ** 2 for a, b in zip(mine, t, strict=True)) for t in taken)

    return max(candidates, key=distance)


def rank_scales(vary: Mapping[str, list[Any]]) -> dict[str, Callable[[Any], float]]:
    """Per field, a value's place in [0, 1]: by value for numbers (a field of numbers is ordered),
    by position for anything else."""
    out: dict[str, Callable[[Any], float]] = {}
    for k, values in vary.items():
        keys = [space_mod.point_key({k: v}) for v in values]
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        order = (
            sorted(range(len(values)), key=lambda i: float(values[i]))
            if numeric
            else list(range(len(values)))
        )
        place = {keys[i]: n / max(1, len(values) - 1) for n, i in enumerate(order)}

        def scale(v: Any, k: str = k, place: dict[str, float] = place) -> float:
            return place.get(space_mod.point_key({k: v}), 0.5)

        out[k] = scale
    return out


def _places(
    points: Sequence[space_mod.Point],
    shapes: Mapping[str, surrogate.Shape],
    ranks: Mapping[str, Callable[[Any], float]],
) -> dict[str, list[float]]:
    """Search._place of every point."""
    raw = {}
    for p in points:
        s = shapes[p.key]
        depth = min(s.steps, s.draft - 1) if s.spec else 0
        known = [float(depth), float(s.draft), float(s.steps), float(s.cuda_graph)]
        raw[p.key] = known + [ranks[k](v) for k, v in p.params.items() if k not in surrogate.KNOWN]
    if not raw:
        return {}
    width = len(next(iter(raw.values())))
    low = [min(v[i] for v in raw.values()) for i in range(width)]
    high = [max(v[i] for v in raw.values()) for i in range(width)]
    return {
        k: [(x - lo) / (hi - lo) if hi > lo else 0.0 for x, lo, hi in zip(v, low, high, strict=True)]
        for k, v in raw.items()
    }


class Search:
    """The order in which a campaign measures the valid points of a space."""

    def __init__(self, x: space_mod.Expanded, shapes: Mapping[str, surrogate.Shape]) -> None:
        self.x = x
        self.settings = x.space.search
        self.valid = x.valid
        self.shapes = dict(shapes)
        self.ranks = rank_scales(x.space.vary)
        self.order = list(self.valid)
        if self.settings.sampler == "random":
            random.Random(self.settings.seed).shuffle(self.order)
        self.incumbent = None if self.settings.sampler == "grid" else x.incumbent
        self.rng = random.Random(self.settings.seed)
        self._places = _places(self.valid, self.shapes, self.ranks)

    def _place(self, p: space_mod.Point) -> list[float]:
        """Where `p` lies in what it runs, each axis scaled to 0..1 over the valid points: the
        tree's depth, its draft tokens, the draft steps, CUDA graphs, then the rank of each field
        the model has no structure for. Two points that run the same tree (eagle_topk 1 or 4 with
        2 draft tokens) lie at one place."""
        return self._places[p.key]

    def _distance(self, p: space_mod.Point, measured: Sequence[space_mod.Point]) -> float:
        """How far `p` is from the nearest measured point, 0..1 (the space's diagonal is 1)."""
        if not measured:
            return 1.0
        mine = self._place(p)
        near = min(math.dist(mine, self._place(q)) for q in measured)
        return min(1.0, near / math.sqrt(max(1, len(mine))))

    def guesses(
        self, points: Sequence[space_mod.Point], done: set[str], fit: surrogate.Fit, ctx: Context
    ) -> dict[str, Guess]:
        """The model's gain of each of `points`, its spread widened by the distance to the nearest
        point in `done`."""
        measured = [p for p in self.valid if p.key in done]
        distance = {p.key: self._distance(p, measured) for p in points}
        return guesses(fit, {p.key: self.shapes[p.key] for p in points}, ctx, distance)

    def next(
        self,
        done: set[str],
        pending: set[str],
        fit: surrogate.Fit | None,
        ctx: Context | None,
        best: float | None,
    ) -> tuple[space_mod.Point, Guess | None] | None:
        """The next point to measure (None: every valid point is measured or in flight), and the
        model's guess for it where the model chose it."""
        left = [p for p in self.order if p.key not in done and p.key not in pending]
        if not left:
            return None
        if self.settings.sampler != "model":
            return left[0], None
        first = self.incumbent
        if first is not None and first.key not in done | pending:
            return first, None
        seen = [p for p in self.valid if p.key in done or p.key in pending]
        if len(seen) < self.settings.startup_trials or fit is None or ctx is None:
            return _farthest(left, seen, self.ranks), None
        found = self.guesses(left, done, fit, ctx)
        if not found:
            return _farthest(left, seen, self.ranks), None
        bar = best if best is not None else 1.0
        # a point in flight on another host is not asked again; the fit learns of it when it ends
        key = max(found, key=lambda k: (expected_improvement(found[k], bar), found[k].mean))
        return next(p for p in left if p.key == key), found[key]
