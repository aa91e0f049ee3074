"""What a campaign found, and the words it says it with.

Engine layer: never prints. tune.py fills an `Outcome`; the CLI (tune_command.py) shows it.

- `LevelBest` rows: per level of the traffic, the baseline and the best measured settings.
- `per_load(...)`: the best setting at each level, and the load at which the next one takes over.
- `verdict(...)`: the scored level's one line. It claims only what was measured or predicted:
  "no setting beats the baseline" needs every point left unmeasured predicted not to, with its
  uncertainty; otherwise it names the points it could not rule out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.profile import model as profile_mod
from orchestrator.tuning import objective as objective_mod
from orchestrator.tuning import search as search_mod
from orchestrator.tuning import space as space_mod
from orchestrator.tuning import stats
from orchestrator.tuning import sweep as sweep_mod

#: A point whose chance of beating the baseline the model puts above this is not ruled out.
RULE_OUT = 0.05


@dataclass
class Trial:
    """One deploy and bench of a point (or of the baseline) on one host."""

    number: int
    kind: str  # baseline, trial, confirm
    params: dict[str, Any]
    profile: profile_mod.Profile
    host: str
    state: str = ""  # complete, stopped, failed, infeasible
    value: float | None = None
    restarted: bool = True
    diagnosis: str = ""
    #: its bench runs' curve_id
    curve_id: str = ""
    #: Its restart's cost, where the start went (`healthy after 13s: weights 7.2s, ...`); "" when
    #: its host was not restarted for it.
    startup: str = ""
    #: the gain the model predicted before it was measured (None: the model did not choose it)
    predicted: float | None = None

    @property
    def label(self) -> str:
        return space_mod.label(self.params) if self.params else self.profile.name

    def row(self, campaign_id: str) -> dict[str, Any]:
        return {
            "campaign_id": campaign_id,
            "number": self.number,
            "kind": self.kind,
            "point": space_mod.point_key(self.params),
            "profile": self.profile.name,
            "host": self.host,
            "state": self.state,
            "value": self.value,
            "restarted": int(self.restarted),
            "diagnosis": self.diagnosis[:500],
            "curve_id": self.curve_id,
            "predicted": self.predicted,
        }


@dataclass
class LevelBest:
    """A table row of the outcome: one setting at one level, or the baseline."""

    level: sweep_mod.Level
    profile: str
    label: str
    tok_s: stats.Interval | None
    #: the objective's gain over the baseline at this level (higher better; 1 = the baseline)
    speedup: float | None
    accept_len: float | None
    p99_ttft_ms: float | None
    p99_itl_ms: float | None = None
    total_tok_s: float | None = None
    #: False for a trial that breaks the objective's limits: shown, never named best
    feasible: bool = True


def best_row(rows: Sequence[LevelBest]) -> LevelBest | None:
    """The best setting at a level: the highest gain among those that keep the limits."""
    kept = [r for r in rows if r.speedup is not None and r.feasible]
    return max(kept, key=lambda r: r.speedup or 0.0, default=None)


@dataclass
class Handover:
    """Where one setting stops being the best and the next takes over."""

    setting: str
    profile: str
    #: the loads it is best at (`c=8`, `4/s`)
    levels: list[str]


@dataclass
class AdaptiveReport:
    """SGLang's adaptive mode (0.5.23), with tiers from the campaign's own per-level winners,
    against the best static setting at each level."""

    #: batch size -> candidate steps, as the profile gives them
    tiers: dict[int, list[int]]
    profile: str
    #: per level: (load, the best static setting's label, the verdict against it, the ratio)
    levels: list[tuple[str, str, str, float | None]] = field(default_factory=list)
    #: why it was not measured ("" when it was)
    skipped: str = ""

    def line(self) -> str:
        if self.skipped:
            return f"adaptive mode not measured: {self.skipped}"
        tiers = ", ".join(f"{k}: {v}" for k, v in self.tiers.items())
        parts = [
            f"{load} {verdict} {best}" + (f" ({ratio:.2f}x)" if ratio is not None else "")
            for load, best, verdict, ratio in self.levels
        ]
        return f"adaptive mode (tiers {{{tiers}}}): " + "; ".join(parts)


@dataclass
class ModelReport:
    """How well the campaign's model predicted the trials it chose, before they ran."""

    #: mean absolute error of the predicted gain, as a fraction of the measured gain
    error: float | None
    predicted: int
    #: each host's speed factor as the fit estimates it (1: the average host)
    hosts: dict[str, float] = field(default_factory=dict)
    #: the accept model's a, r, g (see surrogate.py)
    accept: tuple[float, float, float] | None = None


@dataclass
class Outcome:
    campaign_id: str
    space: str
    hosts: list[str]
    trials: list[Trial]
    pruned: list[space_mod.Point]
    restarts: int
    grid: int
    #: per level: the baseline's row, then the best trials
    levels: list[tuple[sweep_mod.Level, list[LevelBest]]]
    #: the scored level's verdict, one line
    verdict: str
    #: the leaders' comparison: "separated", "tie" or "" (fewer than two leaders)
    leaders: str = ""
    winner: Trial | None = None
    winner_beats_baseline: bool = False
    winner_file: str = ""
    #: why the winner's file was not written ('': it was, or there is no winner)
    winner_error: str = ""
    left: str = ""
    left_ok: bool = False
    left_message: str = ""
    wall_s: float = 0.0
    #: trials that failed to start, with their diagnosis
    failures: list[Trial] = field(default_factory=list)
    #: the best setting per level, in load order: one entry per run of levels it wins
    per_load: list[Handover] = field(default_factory=list)
    #: the per-load answer in one line ("" when one setting is best everywhere)
    per_load_line: str = ""
    #: points the campaign could not rule out (labels), where it found nothing better
    open_points: list[str] = field(default_factory=list)
    model: ModelReport | None = None
    objective: str = ""
    adaptive: AdaptiveReport | None = None


def where(level: sweep_mod.Level) -> str:
    if level.request_rate is not None:
        return f"at {level.axis} {level.x:g}"
    return f"at concurrency {level.concurrency}"


def per_load(
    levels: Sequence[tuple[sweep_mod.Level, Sequence[LevelBest]]], baseline: str
) -> tuple[list[Handover], str]:
    """The best setting at each level (the baseline where nothing beats it), merged where one
    wins neighbouring levels; and a line saying where each takes over."""
    runs: list[Handover] = []
    for level, rows in levels:
        best = best_row(rows)
        if best is None:
            continue
        label = "the baseline" if best.profile == baseline else best.label
        if runs and runs[-1].profile == best.profile:
            runs[-1].levels.append(level.load)
        else:
            runs.append(Handover(label, best.profile, [level.load]))
    if len(runs) < 2:
        return runs, ""
    parts = [f"{runs[0].setting} up to {runs[0].levels[-1]}"]
    parts += [f"{h.setting} from {h.levels[0]}" for h in runs[1:]]
    return runs, "no one setting is best at every load: " + "; ".join(parts)


def verdict(
    goal: objective_mod.Goal,
    level: sweep_mod.Level,
    winner: Trial | None,
    mine: Sequence[float],
    base: Sequence[float],
    open_points: Sequence[str],
    left_to_try: int,
) -> tuple[str, bool]:
    """The scored level's line and whether the winner beats the baseline. `mine` and `base` are
    per-run gains (1 = the baseline's mean). `open_points` are unmeasured points the model could
    not rule out; `left_to_try` is how many valid points were never measured."""
    at = where(level) if goal.kind != "goodput" else "over the curve"
    if winner is None:
        return f"{at} no trial was measured: see the failures", False
    found = stats.compare(list(mine), list(base)) if mine and base else None
    ratio = sum(mine) / len(mine) if mine else 0.0
    said = goal.words(ratio)
    if found is not None and found.verdict == "faster":
        p = f", p={found.p_value:.3g}" if found.p_value is not None else ""
        return f"{at} {winner.label} beats the baseline: {said}{p}", True
    if found is not None and found.verdict == "too few runs":
        return f"{at} too few runs to tell (best {winner.label}: {said})", False
    if open_points:
        more = len(open_points)
        return (
            f"{at} nothing measured beats the baseline (best {winner.label}: {said}); the model cannot "
            f"rule out {', '.join(open_points[:3])}{' and more' if more > 3 else ''}: about {more} more "
            "restart(s) would settle it",
            False,
        )
    noise = "beyond noise " if found is not None and found.verdict == "within noise" else ""
    rest = f"; the model predicts none of the {left_to_try} unmeasured points would" if left_to_try else ""
    best = f"(best {winner.label}: {said})"
    return f"{at} no setting of the space beats the baseline {noise}{best}{rest}", False


def open_points(found: Mapping[str, search_mod.Guess], labels: Mapping[str, str], margin: float) -> list[str]:
    """Unmeasured points whose chance of beating the baseline by `margin` is not negligible, most
    likely first."""
    chances = {k: g.chance_above(1.0 + margin) for k, g in found.items()}
    return [labels[k] for k in sorted(chances, key=lambda k: -chances[k]) if chances[k] > RULE_OUT]
