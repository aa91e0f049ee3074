"""tune: search a space of profile settings for the one that serves a team's traffic best.

It does so with few restarts, on every host at once, and it survives an interruption.

Engine layer: never prints. `Campaign.run()` returns an `Outcome`. The CLI (tune_command.py) shows
it.

- The space file (space.py) expands to points. Each point is a derived profile, through every
  profile rule. Points a rule refuses are pruned with the rule's message, and cost nothing.
- Optuna's sampler (TPE by default, or grid or random) asks for the next point. One trial is one
  restart (deploy, with all its safety) and a bench of the space's traffic. With N hosts, a round
  deploys N trials in one play (`deploy(each=...)`), then benches them side by side.
- Hosts differ. So each host measures the baseline first. A trial scores as the ratio of its metric
  to its own host's baseline, at the scored level.
- Early stopping: a trial's first run is at the scored level. A trial clearly behind the best
  finished trial stops there (Optuna pruner `_Behind`). The rest get the whole curve `repeat`
  times.
- Then the two leaders get more runs, until Welch's test separates them. Or until the
  `search.confirm` runs are spent, or the restart budget is. A tie is reported as one.
- The ledger is the memory. Bench rows carry the campaign's id as their sweep_id. Every finished
  trial is a `trials` row. So `--resume ID` replays them into the sampler, and measures nothing
  twice. The campaign holds each host's deploy lock from its first deploy to its last.
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import ledger
from orchestrator.errors import InputError, Interrupted, OrchestratorError
from orchestrator.hosts import deploy as deploy_mod
from orchestrator.hosts.runner import TaskEvent
from orchestrator.profile import model as profile_mod
from orchestrator.tuning import bench as bench_mod
from orchestrator.tuning import space as space_mod
from orchestrator.tuning import stats
from orchestrator.tuning import sweep as sweep_mod

if TYPE_CHECKING:
    import optuna

#: The least margin by which a first look must trail the best finished trial to stop it, and
#: how many run-to-run standard deviations (of the baselines' runs) it is otherwise.
MIN_MARGIN = 0.02
MARGIN_SIGMAS = 3.0
#: How long a campaign's host lock lasts after its latest deploy: longer than any trial's bench,
#: so no other deploy takes a host between two trials; a campaign that died on this control
#: machine leaves a lock that the next deploy from here takes over at once (a dead PID).
LOCK_TTL_S = 4 * 3600.0
#: A sampler that asks only measured or pruned points this many times in a row has no new
#: point to offer: an unmeasured valid point is then drawn at random.
MAX_ASKS = 40


def settings_level(s: bench_mod.Settings) -> sweep_mod.Level:
    """The ledger level (sweep.Level) a bench of these settings records."""
    return sweep_mod.level_of(
        {
            "endpoint": s.endpoint,
            "dataset_digest": s.source.digest,
            "concurrency": s.concurrency,
            "request_rate": s.request_rate,
            "temperature": s.temperature,
            "max_tokens": s.max_tokens,
            "dataset": s.source.name,
        }
    )


# --- scoring: from ledger rows ------------------------------------------------------------------


def _metric(row: Mapping[str, Any], name: str) -> float | None:
    value = row[name]
    return None if value is None else float(value)


def runs_at(
    rows: Iterable[Mapping[str, Any]], profile: str, level: sweep_mod.Level
) -> list[Mapping[str, Any]]:
    """A profile's runs at `level` that measured something."""
    return [
        r
        for r in rows
        if r["profile"] == profile and sweep_mod.measured(r) and sweep_mod.level_of(r) == level
    ]


def _per_host(
    rows: Iterable[Mapping[str, Any]], profile: str, level: sweep_mod.Level, metric: str
) -> dict[str, list[float]]:
    """A profile's metric at `level`, run by run, per host."""
    found: dict[str, list[float]] = {}
    for r in runs_at(rows, profile, level):
        value = _metric(r, metric)
        if value is not None:
            found.setdefault(r["host"], []).append(value)
    return found


def baselines(
    rows: Iterable[Mapping[str, Any]], baseline: str, level: sweep_mod.Level, metric: str
) -> dict[str, float]:
    """Per host, the mean of the baseline's runs at `level`."""
    return {h: statistics.fmean(v) for h, v in _per_host(rows, baseline, level, metric).items()}


def ratios(
    rows: Iterable[Mapping[str, Any]],
    profile: str,
    level: sweep_mod.Level,
    metric: str,
    base: Mapping[str, float],
) -> list[float]:
    """A profile's runs at `level`, each as a ratio to its own host's baseline mean."""
    out = []
    for r in runs_at(rows, profile, level):
        value, ref = _metric(r, metric), base.get(r["host"])
        if value is not None and ref:
            out.append(value / ref)
    return out


def run_noise(
    rows: Iterable[Mapping[str, Any]], baseline: str, level: sweep_mod.Level, metric: str
) -> float | None:
    """The baselines' run-to-run coefficient of variation at `level`, pooled over hosts."""
    cvs = [
        statistics.stdev(v) / statistics.fmean(v)
        for v in _per_host(rows, baseline, level, metric).values()
        if len(v) > 1 and statistics.fmean(v)
    ]
    return statistics.fmean(cvs) if cvs else None


def p99_ttft_ms(rows: Iterable[Mapping[str, Any]], profile: str, level: sweep_mod.Level) -> float | None:
    values = [
        float(r["ttft_p99_s"]) * 1000 for r in runs_at(rows, profile, level) if r["ttft_p99_s"] is not None
    ]
    return statistics.fmean(values) if values else None


# --- the campaign's records ---------------------------------------------------------------------


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
        }


@dataclass
class Status:
    """What a live display shows: the campaign as it stands."""

    campaign_id: str
    phase: str
    restarts_used: int
    budget: int
    trials_done: int
    #: host -> what it does now
    running: dict[str, str]
    best: str = ""
    best_value: float | None = None
    #: seconds left, estimated from the trials so far (None before the first)
    eta_s: float | None = None


@dataclass
class LevelBest:
    """A table row of the outcome: the best fully measured setting at one level, or the baseline."""

    level: sweep_mod.Level
    profile: str
    label: str
    tok_s: stats.Interval | None
    speedup: float | None
    accept_len: float | None
    p99_ttft_ms: float | None


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
    left: str = ""
    left_ok: bool = False
    left_message: str = ""
    wall_s: float = 0.0
    #: trials that failed to start, with their diagnosis
    failures: list[Trial] = field(default_factory=list)


# --- the search ---------------------------------------------------------------------------------


class _Stop(Exception):
    """Ctrl-C seen between two bench runs."""


def _optuna() -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _pruner(margin: Callable[[], float]) -> optuna.pruners.BasePruner:
    import optuna  # the typed module, not _optuna()'s Any: mypy takes a base class only from one it knows

    class Behind(optuna.pruners.BasePruner):
        """Stop a trial whose first look trails the best finished trial by more than the margin
        (three run-to-run standard deviations of the baselines, at least 2%)."""

        def prune(self, study: Any, trial: Any) -> bool:
            step = trial.last_step
            if step is None:
                return False
            value = trial.intermediate_values[step]
            done = [
                t.value for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            ]
            done = [v for v in done if v]
            return bool(done) and value < max(done) * (1.0 - margin())

    return Behind()


def _ordinal(values: Sequence[Any]) -> bool:
    """Whether a field's values are all numbers: then the sampler sees their order (TPE models
    neighbours alike), not unrelated categories."""
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def _ranks(values: Sequence[Any]) -> list[int]:
    """The value indexes in the sampler's order: by value for numbers, else as written."""
    order = list(range(len(values)))
    return sorted(order, key=lambda i: float(values[i])) if _ordinal(values) else order


def _sampler(search: space_mod.Search, vary: Mapping[str, list[Any]]) -> optuna.samplers.BaseSampler:
    """The sampler over each field's value indexes (Optuna copies what it keeps, and a value
    keeps its text only as the space file's own object)."""
    import optuna

    if search.sampler == "grid":

        class Grid(optuna.samplers.GridSampler):
            def after_trial(self, *args: Any) -> None:
                """Optuna's stops the study once every point was asked, which only an optimize()
                loop may do: here the campaign sees that no new point comes."""

        return Grid({k: list(range(len(v))) for k, v in vary.items()}, seed=search.seed)
    if search.sampler == "random":
        return optuna.samplers.RandomSampler(seed=search.seed)
    with warnings.catch_warnings():  # multivariate TPE is marked experimental
        warnings.simplefilter("ignore")
        return optuna.samplers.TPESampler(
            seed=search.seed, n_startup_trials=search.startup_trials, multivariate=True
        )


@dataclass
class Options:
    leave: str = "best"  # best, baseline, none
    on_event: Callable[[TaskEvent], None] | None = None
    on_status: Callable[[Status], None] | None = None
    on_trial: Callable[[Trial], None] | None = None
    #: where the winner's profile file goes (default: the profiles folder)
    profiles_dir: Path | None = None


class Campaign:
    """One tuning campaign over `hosts`; new, or resumed from the ledger (`resume`)."""

    def __init__(
        self,
        expanded: space_mod.Expanded,
        inventory: Path,
        hosts: Sequence[str],
        options: Options | None = None,
        resume: str | None = None,
    ):
        self.x = expanded
        self.inventory = inventory
        self.hosts = list(hosts)
        self.options = options or Options()
        self.id = resume or uuid.uuid4().hex[:12]
        self.resumed = resume is not None
        s = expanded.space
        self.metric = s.objective.maximize
        self.scored = expanded.level()
        self.level = settings_level(self.scored)
        self.baseline = expanded.baseline
        self.by_key = {p.key: p for p in expanded.points}
        self.dists: dict[str, Any] = {}
        #: field -> value indexes in the sampler's order (by value, for a field of numbers)
        self.ranks: dict[str, list[int]] = {}
        #: the point a search asks first (a grid asks every point in its own order)
        self.incumbent = None if expanded.space.search.sampler == "grid" else expanded.incumbent
        self.trials: list[Trial] = []
        #: host -> the profile it runs now (None: unknown, after a failed deploy)
        self.deployed: dict[str, profile_mod.Profile | None] = dict.fromkeys(self.hosts)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.running: dict[str, str] = {}
        self.started = time.monotonic()
        self.phase = ""
        self.durations: list[float] = []
        #: curve ids of the runs that count (rows())
        self.curves: set[str] = set()

    # ---- ledger

    def rows(self) -> list[Any]:
        """The campaign's bench runs that count: those of recorded trials and of the ones in
        flight (a trial cut off by Ctrl-C left runs that a resumed campaign measures anew)."""
        return [
            r for r in ledger.bench_results() if r["sweep_id"] == self.id and r["curve_id"] in self.curves
        ]

    @property
    def restarts_used(self) -> int:
        return sum(1 for t in self.trials if t.restarted)

    @property
    def budget(self) -> int:
        return self.x.space.budget.restarts

    def _record(self, trial: Trial) -> None:
        with self.lock:
            self.trials.append(trial)
        ledger.record_trial(trial.row(self.id))
        if self.options.on_trial:
            self.options.on_trial(trial)

    def _status(self) -> None:
        if not self.options.on_status:
            return
        best = self._ranked()[:1]
        done = [t for t in self.trials if t.kind == "trial"]
        eta = None
        if self.durations:
            per = statistics.fmean(self.durations)
            eta = max(0, self.budget - self.restarts_used) * per / max(1, len(self.hosts))
        self.options.on_status(
            Status(
                self.id,
                self.phase,
                self.restarts_used,
                self.budget,
                len(done),
                dict(self.running),
                best[0].label if best else "",
                best[0].value if best else None,
                eta,
            )
        )

    # ---- set-up

    def _start(self) -> None:
        if not self.resumed and self.budget < len(self.hosts) + 1:
            raise InputError(
                f"{self.x.path}: budget.restarts {self.budget} does not cover a baseline on each of the "
                f"{len(self.hosts)} hosts and one trial: raise it to at least {len(self.hosts) + 1}, "
                "or --limit fewer hosts"
            )
        if self.resumed:
            row = ledger.campaign(self.id)
            if row is None:
                raise InputError(
                    f"no campaign {self.id} in the ledger ({ledger.path()}): check the id "
                    "(`results` shows each bench row's sweep_id)"
                )
            if row["space_digest"] != self.x.digest:
                raise InputError(
                    f"{self.x.path} is not the file campaign {self.id} began with (digest {self.x.digest}, "
                    f"campaign's {row['space_digest']}): resume with that file, or start a new campaign"
                )
            if not self.hosts:
                self.hosts = json.loads(row["hosts"])
                self.deployed = dict.fromkeys(self.hosts)
            ledger.update_campaign(self.id, status="running", hosts=json.dumps(self.hosts))
            self._replay()
        else:
            ledger.record_campaign(
                {
                    "id": self.id,
                    "space_path": str(self.x.path),
                    "space_digest": self.x.digest,
                    "space": self.x.path.read_text(errors="replace"),
                    "hosts": json.dumps(self.hosts),
                    "status": "running",
                }
            )
        optuna = _optuna()
        self.ranks = {k: _ranks(v) for k, v in self.x.space.vary.items()}
        self.dists = {
            k: (
                optuna.distributions.IntDistribution(0, len(v) - 1)
                if _ordinal(v)
                else optuna.distributions.CategoricalDistribution(list(range(len(v))))
            )
            for k, v in self.x.space.vary.items()
        }
        sampler = _sampler(self.x.space.search, self.x.space.vary)
        self.study = optuna.create_study(direction="maximize", sampler=sampler, pruner=_pruner(self._margin))
        for t in self.trials:
            if t.kind == "trial":
                self._tell_known(t)

    def _replay(self) -> None:
        """The finished trials of the campaign so far, as they were recorded."""
        for r in ledger.trials(self.id):
            params = json.loads(r["point"])
            point = self.by_key.get(space_mod.point_key(params))
            prof = point.profile if point and point.profile else self.baseline
            trial = Trial(
                r["number"],
                r["kind"],
                point.params if point else params,  # the values as read, numbers with their text
                prof,
                r["host"],
                r["state"],
                r["value"],
                bool(r["restarted"]),
                r["diagnosis"],
                r["curve_id"],
            )
            self.curves.add(r["curve_id"])
            self.trials.append(trial)

    def _tell_known(self, t: Trial) -> None:
        """Give the sampler a trial measured before (a resumed campaign's, or a point asked again)."""
        optuna = _optuna()
        states = optuna.trial.TrialState
        if t.state in ("complete", "infeasible"):
            frozen = optuna.trial.create_trial(
                params=self._indexes(t.params),
                distributions=self.dists,
                value=t.value if t.state == "complete" else 0.0,
            )
        elif t.state == "stopped":
            frozen = optuna.trial.create_trial(
                params=self._indexes(t.params),
                distributions=self.dists,
                state=states.PRUNED,
                intermediate_values={0: t.value or 0.0},
            )
        else:
            frozen = optuna.trial.create_trial(
                params=self._indexes(t.params), distributions=self.dists, state=states.FAIL
            )
        self.study.add_trial(frozen)

    def _values(self, indexes: Mapping[str, int]) -> dict[str, Any]:
        """A sampler's point (a rank per field) as the space's values, in the space's order."""
        return {k: v[self.ranks[k][indexes[k]]] for k, v in self.x.space.vary.items()}

    def _indexes(self, params: Mapping[str, Any]) -> dict[str, int]:
        """The sampler's rank of each value among its field's, found by the text it was written
        with."""
        out = {}
        for k, values in self.x.space.vary.items():
            keys = [space_mod.point_key({k: v}) for v in values]
            out[k] = self.ranks[k].index(keys.index(space_mod.point_key({k: params[k]})))
        return out

    def _margin(self) -> float:
        noise = run_noise(self.rows(), self.baseline.name, self.level, self.metric)
        return max(MIN_MARGIN, MARGIN_SIGMAS * noise) if noise is not None else 0.05

    def _stopped(self, where: str) -> str:
        return (
            f"tune campaign {self.id} stopped by Ctrl-C{where}; its finished trials are in the ledger: "
            f"go on with `tune {self.x.path} --resume {self.id}`"
        )

    # ---- deploy and bench

    def _deploy(self, assign: dict[str, profile_mod.Profile]) -> dict[str, str]:
        """Deploy each host's profile in one play, holding the campaign's lock; host -> '' when it
        runs healthy, else the diagnosis."""
        options = deploy_mod.Options(
            lock_id=f"tune-{self.id}",
            keep_lock=True,
            lock_profile=f"tune campaign {self.id}",
            lock_ttl_s=LOCK_TTL_S,
        )
        lead = next(iter(assign.values()))
        report = deploy_mod.deploy(lead, self.inventory, options, self.options.on_event, each=assign)
        if report.interrupted:
            raise Interrupted(self._stopped(" while deploying (hosts it changed were rolled back)"))
        out: dict[str, str] = {}
        for host in assign:
            r = next((h for h in report.hosts if h.host == host), None)
            if r is not None and r.ok:
                out[host] = ""
                self.deployed[host] = assign[host]
            else:
                why = "not in the play" if r is None else (r.diagnosis or r.message or r.step)
                if r is not None and r.rolled_back_to:
                    why += f" (rolled back to {r.rolled_back_to})"
                out[host] = f"{host}: {why}"
                self.deployed[host] = None
            restarted = r.restarted if r is not None else False
            out[host + "\0restarted"] = "1" if (restarted or (r is not None and not r.ok)) else ""
            out[host + "\0startup"] = r.startup if r is not None else ""
        return out

    def _bench(self, trial: Trial, sessions: dict[str, Any], first_look: Any | None) -> None:
        """The trial's traffic on its host: the scored level first (one run: the first look, which
        may stop it), then every level `repeat` times. Fills trial.state and trial.value."""
        target, log = sessions[trial.host]
        traffic = self.x.traffic
        levels = traffic.levels()
        scored = next(s for s in levels if settings_level(s) == self.level)
        order = [(scored, 0)] + [
            (s, k) for s in levels for k in range(traffic.repeat) if (s, k) != (scored, 0)
        ]
        if trial.kind == "confirm":
            order = [(scored, 0)]
        curve_id = trial.curve_id = uuid.uuid4().hex[:12]
        with self.lock:
            self.curves.add(curve_id)
        base_row = {
            "sweep_id": self.id,
            "profile": trial.profile.name,
            "speculative": int(trial.profile.speculative.algorithm is not None),
        }
        for i, (settings, k) in enumerate(order):
            if self.stop.is_set():
                raise _Stop
            self.running[trial.host] = f"{trial.label}: bench {settings.level} ({i + 1}/{len(order)})"
            self._status()
            try:
                result = bench_mod.run(target, settings, None, log)
            except OrchestratorError as exc:
                sweep_mod._record_failure(
                    base_row, uuid.uuid4().hex[:12], trial.host, f"bench failed: {exc}", settings
                )
                trial.state, trial.diagnosis = "failed", f"{trial.host}: bench failed: {exc}"
                return
            result.curve_id, result.repeat = curve_id, k
            bench_mod.record(result, self.id)
            if i == 0 and first_look is not None and trial.kind == "trial":
                value = self._value(trial.profile.name)
                if value is not None:
                    first_look.report(value, 0)
                    if self.x.space.search.early_stop and first_look.should_prune():
                        trial.state, trial.value = "stopped", value
                        return
        trial.value = self._value(trial.profile.name)
        own = baselines(self.rows(), self.baseline.name, self.level, self.metric)
        if trial.kind == "baseline" and trial.host not in own:
            trial.state = "failed"
            trial.diagnosis = f"{trial.host}: the baseline measured nothing at {settings_level(scored).load}"
            return
        if trial.value is None:
            trial.state, trial.diagnosis = "failed", f"{trial.host}: no run measured anything"
            return
        limit = self.x.space.objective.p99_ttft_ms_max
        ttft = p99_ttft_ms(self.rows(), trial.profile.name, self.level)
        if limit is not None and ttft is not None and ttft > limit:
            trial.state, trial.diagnosis = "infeasible", f"p99 TTFT {ttft:.0f} ms over {limit:g} ms"
        else:
            trial.state = "complete"

    def _value(self, profile: str) -> float | None:
        rows = self.rows()
        base = baselines(rows, self.baseline.name, self.level, self.metric)
        found = ratios(rows, profile, self.level, self.metric, base)
        return statistics.fmean(found) if found else None

    def _sessions(self, hosts: Iterable[str]) -> dict[str, Any]:
        """Per host: the bench target (the deployed plan) and a journal reader, read here in the
        main thread (Ansible's in-process inventory is not thread-safe; the reader's plays are
        serialised)."""
        out = {}
        for host in hosts:
            prof = self.deployed[host]
            assert prof is not None
            reader = bench_mod.journal_messages(self.inventory, host, prof.service.unit_name)
            out[host] = (bench_mod.deployed_target(self.inventory, host, prof), self._serialised(reader))
        return out

    _ansible = threading.Lock()

    def _serialised(self, read: Callable[[float], list[str]]) -> Callable[[float], list[str]]:
        def locked(since: float) -> list[str]:
            with Campaign._ansible:
                return read(since)

        return locked

    def _round(self, assign: dict[str, Trial], asked: dict[str, Any]) -> None:
        """Deploy the round's trials in one play, bench the healthy ones side by side, record."""
        begun = time.monotonic()
        for host, t in assign.items():
            self.running[host] = f"{t.label}: deploy"
        self._status()
        outcome = self._deploy({h: t.profile for h, t in assign.items()})
        healthy = []
        for host, t in assign.items():
            t.restarted = bool(outcome.get(host + "\0restarted"))
            t.startup = outcome.get(host + "\0startup", "")
            if outcome[host]:
                t.state, t.diagnosis = "failed", outcome[host]
            else:
                healthy.append(host)
        self._bench_all({h: assign[h] for h in healthy}, asked)
        for host, t in assign.items():
            self.running.pop(host, None)
            if host not in healthy:
                self._finish(t, asked.get(host))
        self.durations.append(time.monotonic() - begun)
        self._status()

    def _bench_all(self, assign: dict[str, Trial], asked: Mapping[str, Any]) -> None:
        """Bench each host's trial side by side; each one finished is told and recorded at once.
        Ctrl-C lets the runs in flight end, records the trials that finished and raises
        Interrupted; a trial cut off mid-bench is not recorded (its runs never count: rows())."""
        sessions = self._sessions(assign)
        with ThreadPoolExecutor(max_workers=max(1, len(assign))) as pool:
            futures = {h: pool.submit(self._bench, t, sessions, asked.get(h)) for h, t in assign.items()}
            pending = dict(futures)
            try:
                while pending:
                    for host, f in list(pending.items()):
                        try:
                            f.result(timeout=0.2)
                        except TimeoutError:
                            continue
                        del pending[host]
                        self.running.pop(host, None)
                        self._finish(assign[host], asked.get(host))
            except KeyboardInterrupt:
                self.stop.set()
                for host, f in pending.items():
                    try:
                        f.result()
                    except _Stop:
                        continue
                    self._finish(assign[host], asked.get(host))
                raise Interrupted(self._stopped(" while benching")) from None

    def _finish(self, t: Trial, asked: Any | None) -> None:
        if t.kind == "trial" and asked is not None:
            self._tell(asked, t)
        if t.kind == "confirm" and t.state != "failed":
            t.state = "complete"
        self._record(t)

    def _tell(self, asked: Any, t: Trial) -> None:
        optuna = _optuna()
        states = optuna.trial.TrialState
        if t.state == "complete":
            self.study.tell(asked, t.value)
        elif t.state == "infeasible":
            self.study.tell(asked, 0.0)
        elif t.state == "stopped":
            self.study.tell(asked, state=states.PRUNED)
        else:
            self.study.tell(asked, state=states.FAIL)

    # ---- phases

    def _measured(self) -> dict[str, Trial]:
        """Point key -> its finished trial (the search measures nothing twice)."""
        return {space_mod.point_key(t.params): t for t in self.trials if t.kind == "trial"}

    def _baselines(self) -> None:
        """Each host that has no baseline measured in this campaign gets one (complete only where
        that host's own runs at the scored level measured something)."""
        have = {t.host for t in self.trials if t.kind == "baseline" and t.state == "complete"}
        todo = [h for h in self.hosts if h not in have]
        if not todo:
            return
        self.phase = "baseline"
        assign = {h: Trial(-1, "baseline", {}, self.baseline, h) for h in todo}
        self._round(assign, {})
        lost = [t for t in assign.values() if t.state != "complete"]
        for t in lost:  # a host without a baseline cannot score its trials
            self.hosts.remove(t.host)
        if not self.hosts:
            raise OrchestratorError(
                "no host measured the baseline, so no trial could be scored: "
                + "; ".join(t.diagnosis for t in lost)
            )

    def _next_point(self, taken: set[str]) -> tuple[Any, space_mod.Point] | None:
        """Ask the sampler for a valid point not measured yet (pruned points are told as pruned,
        measured ones as what they measured); None when the space has no such point left."""
        measured = self._measured()
        optuna = _optuna()
        first = self.incumbent
        if first is not None and first.key not in measured and first.key not in taken:
            # once: whatever became of it (failed, stopped), a trial of it is recorded
            self.study.enqueue_trial(self._indexes(first.params))
            return self.study.ask(self.dists), first
        for _ in range(MAX_ASKS):
            asked = self.study.ask(self.dists)
            point = self.by_key[space_mod.point_key(self._values(asked.params))]
            if point.profile is None:
                self.study.tell(asked, state=optuna.trial.TrialState.PRUNED)
            elif point.key in measured or point.key in taken:
                self.study.tell(asked, state=optuna.trial.TrialState.FAIL)
            else:
                return asked, point
        left = [p for p in self.x.valid if p.key not in measured and p.key not in taken]
        if not left:
            return None
        point = random.Random(len(measured)).choice(left)
        self.study.enqueue_trial(self._indexes(point.params))  # the next ask takes these values
        return self.study.ask(self.dists), point

    def _search(self) -> None:
        reserve = confirm_reserve(self.x.space)
        self.phase = "search"
        while not self.stop.is_set():
            free = self.budget - self.restarts_used - reserve
            if free <= 0:
                return
            taken: set[str] = set()
            assign: dict[str, Trial] = {}
            asked: dict[str, Any] = {}
            for host in self.hosts[:free]:
                found = self._next_point(taken)
                if found is None:
                    break
                ask, point = found
                assert point.profile is not None
                taken.add(point.key)
                number = ask.number
                assign[host] = Trial(number, "trial", dict(point.params), point.profile, host)
                asked[host] = ask
            if not assign:
                return
            self._round(assign, asked)

    def _ranked(self) -> list[Trial]:
        """Complete trials, best first (a point's value from every run of it, confirmations too)."""
        best: dict[str, Trial] = {}
        for t in self.trials:
            if t.kind == "trial" and t.state == "complete" and t.value is not None:
                best[t.profile.name] = t
        for t in best.values():
            t.value = self._value(t.profile.name) or t.value
        return sorted(best.values(), key=lambda t: -(t.value or 0.0))

    def _leader_samples(self, t: Trial) -> list[float]:
        rows = self.rows()
        base = baselines(rows, self.baseline.name, self.level, self.metric)
        return ratios(rows, t.profile.name, self.level, self.metric, base)

    def _confirm(self) -> str:
        """More runs of the two leaders at the scored level until Welch's test separates them:
        'separated', 'tie', or '' (fewer than two)."""
        extra = self.x.space.search.confirm
        self.phase = "confirm"
        for _ in range(extra + 1):
            ranked = self._ranked()
            if len(ranked) < 2:
                return ""
            a, b = ranked[0], ranked[1]
            found = stats.compare(self._leader_samples(a), self._leader_samples(b))
            if found.verdict in ("faster", "slower"):
                return "separated"
            done = sum(
                1
                for t in self.trials
                if t.kind == "confirm" and t.profile.name in (a.profile.name, b.profile.name)
            )
            if done >= 2 * extra or self.stop.is_set():
                return "tie"
            assign: dict[str, Trial] = {}
            for leader in (a, b):
                host = next(
                    (
                        h
                        for h, p in self.deployed.items()
                        if p is not None and p.name == leader.profile.name and h not in assign
                    ),
                    None,
                )
                restart = host is None
                if host is None:
                    host = next((h for h in self.hosts if h not in assign), None)
                    if (
                        host is None
                        or self.restarts_used + sum(x.restarted for x in assign.values()) >= self.budget
                    ):
                        continue
                assign[host] = Trial(
                    leader.number, "confirm", leader.params, leader.profile, host, restarted=restart
                )
            if not assign:
                return "tie"
            self._confirm_round(assign)
        return "tie"

    def _confirm_round(self, assign: dict[str, Trial]) -> None:
        """A leader's extra runs: where it still runs, a bench only; elsewhere a deploy first."""
        need = {h: t for h, t in assign.items() if t.restarted}
        if need:
            outcome = self._deploy({h: t.profile for h, t in need.items()})
            for host, t in need.items():
                if outcome[host]:
                    t.state, t.diagnosis = "failed", outcome[host]
                    self._record(t)
                    assign.pop(host)
        self._bench_all(assign, {})

    # ---- outcome

    def _levels(self, top: int = 3) -> list[tuple[sweep_mod.Level, list[LevelBest]]]:
        """Per level of the traffic: the baseline's row, then the `top` fully measured trials by
        their speed-up over their own hosts' baselines."""
        rows = self.rows()
        full = {
            t.profile.name: t
            for t in self.trials
            if t.kind == "trial" and t.state in ("complete", "infeasible")
        }
        out = []
        for settings in self.x.traffic.levels():
            level = settings_level(settings)
            base = baselines(rows, self.baseline.name, level, self.metric)
            scored = [
                (statistics.fmean(v), name)
                for name in full
                if (v := ratios(rows, name, level, self.metric, base))
            ]
            scored.sort(reverse=True)
            entries = [self._level_row(rows, level, self.baseline.name, "baseline", base)]
            entries += [
                self._level_row(rows, level, name, full[name].label, base) for _, name in scored[:top]
            ]
            out.append((level, entries))
        return out

    def _level_row(
        self, rows: list[Any], level: sweep_mod.Level, name: str, label: str, base: Mapping[str, float]
    ) -> LevelBest:
        runs = runs_at(rows, name, level)
        tok = [float(r["tok_s"]) for r in runs]
        accepts = [a for r in runs if (a := sweep_mod._level_accept(r)) is not None]
        found = ratios(rows, name, level, self.metric, base)
        return LevelBest(
            level,
            name,
            label,
            stats.interval(tok) if tok else None,
            statistics.fmean(found) if found else None,
            statistics.fmean(accepts) if accepts else None,
            p99_ttft_ms(rows, name, level),
        )

    def _verdict(self, winner: Trial | None) -> tuple[str, bool]:
        text, beats = self._against_baseline(winner)
        return text + self._against_incumbent(winner), beats

    def _against_incumbent(self, winner: Trial | None) -> str:
        """How the space's own profile (measured first where the space holds its point) did, when
        it is not the winner: what the campaign gained over what ran before it."""
        first = self.x.incumbent
        if winner is None or first is None or first.key == space_mod.point_key(winner.params):
            return f"; it is {self.x.base.name}'s own setting" if winner is not None and first else ""
        t = self._measured().get(first.key)  # its value from every run: _phases ranked it
        if t is None:
            return ""
        how = {"stopped": ", stopped early", "infeasible": ", over the p99 TTFT limit"}.get(t.state, "")
        if t.value is None:
            return f"; {self.x.base.name}'s own setting ({t.label}): {t.state}"
        return f"; {self.x.base.name}'s own setting ({t.label}): {t.value:.2f}x{how}"

    def _against_baseline(self, winner: Trial | None) -> tuple[str, bool]:
        where = (
            f"at {self.level.axis} {self.level.x:g}"
            if self.level.request_rate is not None
            else f"at concurrency {self.level.concurrency}"
        )
        if winner is None:
            return f"{where} no trial was measured: see the failures", False
        rows = self.rows()
        base = baselines(rows, self.baseline.name, self.level, self.metric)
        base_ratios = ratios(rows, self.baseline.name, self.level, self.metric, base)
        mine = self._leader_samples(winner)
        found = stats.compare(mine, base_ratios) if mine and base_ratios else None
        ratio = statistics.fmean(mine) if mine else 0.0
        if found is not None and found.verdict == "faster":
            return (
                f"{where} {winner.label} beats the baseline: {ratio:.2f}x (p={found.p_value:.3g})"
                if found.p_value is not None
                else f"{where} {winner.label} beats the baseline: {ratio:.2f}x",
                True,
            )
        if found is not None and found.verdict == "within noise":
            return (
                f"{where} no speculative setting beats the baseline beyond noise "
                f"(best {winner.label}: {ratio:.2f}x, within noise)",
                False,
            )
        if found is not None and found.verdict == "too few runs":
            return f"{where} too few runs to tell (best {winner.label}: {ratio:.2f}x)", False
        return f"{where} no speculative setting beats the baseline (best {winner.label}: {ratio:.2f}x)", False

    def _write_winner(self, winner: Trial, summary: str) -> str:
        """The winner as a new profile file beside the others: the space's profile with the chosen
        fields; never over an existing file. The path, or '' when there is nowhere to write."""
        folder = self.options.profiles_dir or profile_mod.profiles_dir()[0]
        folder.mkdir(parents=True, exist_ok=True)
        stem = f"{self.x.base.name}-tuned-{self.id[:6]}"
        path = folder / f"{stem}.yml"
        n = 2
        while path.exists():
            path, n = folder / f"{stem}-{n}.yml", n + 1
        extends = self.x.space.extends
        if "/" in extends or extends.endswith((".yml", ".yaml")):
            import os

            extends = os.path.relpath(Path(profile_mod._parent_ref(extends, self.x.path)), folder)
        data: dict[str, Any] = {}
        parent, _ = profile_mod.load_raw(space_mod._ref(self.x.space.extends, self.x.path))
        for key, value in winner.params.items():
            # null is the default: written where the extended profile sets the field (a null there
            # resets it), left out where it does not
            if value is not None or _has(parent, key):
                space_mod._set(data, key, value, keep_null=True)
        text = _dump({"extends": extends, "description": summary, **data})
        header = f"# written by `orchestrator tune` (campaign {self.id}, {self.x.path.name})\n"
        with open(path, "x") as fh:
            fh.write(header + text)
        profile_mod.load(str(path))  # it must validate, as every trial did
        return str(path)

    def _leave(self, outcome: Outcome) -> None:
        """Deploy what `--leave` says on every host, releasing the campaign's lock."""
        leave = self.options.leave
        if leave == "best":
            prof = self.baseline
            if outcome.winner and outcome.winner_beats_baseline:
                # the written file, so that what runs is named as the file that says it
                prof = (
                    profile_mod.load(outcome.winner_file) if outcome.winner_file else outcome.winner.profile
                )
        elif leave == "baseline":
            prof = self.baseline
        else:
            prof = None
        assign = {h: prof or self.deployed.get(h) or self.baseline for h in self.hosts}
        outcome.left = prof.name if prof else "as it was (--leave none)"
        self.phase = f"leave {outcome.left}"
        self._status()
        options = deploy_mod.Options(
            lock_id=f"tune-{self.id}",
            keep_lock=False,
            lock_profile=f"tune campaign {self.id}",
            lock_ttl_s=LOCK_TTL_S,
        )
        report = deploy_mod.deploy(
            next(iter(assign.values())), self.inventory, options, self.options.on_event, each=assign
        )
        if report.interrupted:
            raise Interrupted(
                f"tune campaign {self.id} stopped by Ctrl-C while leaving {outcome.left} deployed; the "
                f"search is done and recorded: `tune {self.x.path} --resume {self.id}` measures nothing "
                "more and deploys it again"
            )
        outcome.left_ok = report.ok
        if not report.ok:
            outcome.left_message = sweep_mod._failure(report)

    def _phases(self) -> Outcome:
        """Baselines, the search, the leaders' extra runs; the outcome, the winner's file and what
        is left deployed."""
        self._baselines()
        self._search()
        leaders = self._confirm()
        ranked = self._ranked()
        winner = ranked[0] if ranked else None
        verdict, beats = self._verdict(winner)
        outcome = Outcome(
            self.id,
            str(self.x.path),
            self.hosts,
            self.trials,
            self.x.pruned,
            self.restarts_used,
            len(self.x.valid),
            self._levels(),
            verdict,
            leaders,
            winner,
            beats,
            failures=[t for t in self.trials if t.state == "failed"],
        )
        if winner is not None:
            outcome.winner_file = self._write_winner(winner, f"tuned: {verdict}")
        self._leave(outcome)
        return outcome

    def run(self) -> Outcome:
        self._start()
        try:
            outcome = self._phases()
        except Interrupted:
            ledger.update_campaign(self.id, status="interrupted")
            raise
        except KeyboardInterrupt:  # between a play and a bench: nothing half-done to undo
            self.stop.set()
            ledger.update_campaign(self.id, status="interrupted")
            raise Interrupted(self._stopped("")) from None
        winner, verdict, leaders = outcome.winner, outcome.verdict, outcome.leaders
        outcome.wall_s = time.monotonic() - self.started
        ledger.update_campaign(
            self.id,
            status="done",
            outcome=json.dumps(
                {
                    "verdict": verdict,
                    "winner": winner.profile.name if winner else None,
                    "winner_file": outcome.winner_file,
                    "leaders": leaders,
                }
            ),
        )
        return outcome


def _has(data: Mapping[str, Any], dotted: str) -> bool:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _dump(data: dict[str, Any]) -> str:
    """YAML of a profile, each number as the text it was read with (yaml12): the winner's
    `1.10` stays `1.10`."""
    import yaml

    from orchestrator.profile import yaml12

    class Dumper(yaml.SafeDumper):
        pass

    def written(dumper: yaml.SafeDumper, value: Any) -> yaml.Node:
        tag = "tag:yaml.org,2002:int" if isinstance(value, int) else "tag:yaml.org,2002:float"
        return dumper.represent_scalar(tag, value.text)

    Dumper.add_representer(yaml12.Int, written)
    Dumper.add_representer(yaml12.Float, written)
    return yaml.dump(data, Dumper=Dumper, sort_keys=False, allow_unicode=True)


# --- --check: what a campaign would do, from the ledger's history --------------------------------

#: Assumed where the ledger has no history to go by.
GUESS_RESTART_S = 120.0
GUESS_TOK_S = 60.0


@dataclass(frozen=True)
class Estimate:
    restarts: int
    #: points measured: the restarts left after each host's baseline (and the leaders' confirmation
    #: reserve), at most the valid points
    trials: int
    rounds: int
    restart_s: float
    #: one trial's bench: the whole curve, `repeat` runs per level
    bench_s: float
    wall_s: float
    #: where the figures come from
    basis: str


def confirm_reserve(space: space_mod.Space) -> int:
    """Restarts the search leaves for the leaders' confirmation: one when it confirms at all."""
    return 1 if space.search.confirm else 0


def trials_for(x: space_mod.Expanded, hosts: int) -> int:
    """How many points a campaign on `hosts` hosts measures: its budget less one baseline a host
    and the restart the leaders' confirmation keeps, at most every valid point."""
    return min(len(x.valid), max(0, x.space.budget.restarts - max(1, hosts) - confirm_reserve(x.space)))


def estimate(x: space_mod.Expanded, hosts: int) -> Estimate:
    """Restarts and wall time of a campaign on `hosts` hosts: each host's baseline, then trials
    up to the budget (or the valid points), `hosts` at a time; restart time from the ledger's
    restarting deploys, bench time from its runs at the same levels."""
    hosts = max(1, hosts)
    trials = trials_for(x, hosts)
    restarts = min(x.space.budget.restarts, hosts + len(x.valid))
    deploys = [
        float(r["duration_s"])
        for r in ledger.history(limit=200)
        if r["restarted"] and r["result"] == "healthy" and r["action"] == "deploy"
    ]
    basis = []
    if deploys:
        restart_s = statistics.median(deploys)
        basis.append(
            f"restart {restart_s:.0f} s: median of the ledger's last {len(deploys)} restarting deploys"
        )
    else:
        restart_s = GUESS_RESTART_S
        basis.append(f"restart {restart_s:.0f} s: a guess (no restarting deploy in the ledger)")
    rows = [r for r in ledger.bench_results() if sweep_mod.measured(r)]
    bench_s, guessed = 0.0, 0
    for s in x.traffic.levels():
        level = settings_level(s)
        same = [float(r["duration_s"]) for r in rows if sweep_mod.level_of(r) == level and r["duration_s"]]
        if same:
            run_s = statistics.median(same)
        else:
            guessed += 1
            streams = max(1, s.concurrency or 1)
            run_s = s.requests * s.max_tokens / (GUESS_TOK_S * streams)
        bench_s += run_s * x.traffic.repeat
    basis.append(
        f"bench {bench_s:.0f} s a trial: "
        + (
            f"{guessed} of {len(x.traffic.levels())} levels guessed at {GUESS_TOK_S:g} tok/s a stream"
            if guessed
            else "the ledger's runs at these levels"
        )
    )
    rounds = -(-trials // hosts) + 1  # the baselines' round first
    return Estimate(
        restarts, trials, rounds, restart_s, bench_s, rounds * (restart_s + bench_s), "; ".join(basis)
    )
