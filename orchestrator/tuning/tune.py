"""tune: search a space of profile settings for the one that serves a team's traffic best.

It does so with few restarts, on every host at once, and it survives an interruption.

Engine layer: never prints. `Campaign.run()` returns an `Outcome` (outcome.py). The CLI
(tune_command.py) shows it. The seams:

- space.py reads the file and expands its grid. Each point is a derived profile, through every
  profile rule; a point a rule refuses is pruned with the rule's message and costs nothing.
- objective.py says what "better" means: the metric, its direction, its limits, goodput.
- surrogate.py fits a model of speculative decoding to what every trial measured (accept length,
  round time, latency), with each host's speed factor.
- search.py picks the next point: the space's own setting, points spread over the space, then
  where the model expects the most improvement.
- This module runs the trials. Each host works on its own: a host that finishes takes the next
  point (a deploy with all its safety, then a bench of the space's traffic). No host waits for
  another's trial. The baseline is measured once, on the first host free, not on every host:
  the model's host factors put every host's runs on one scale.
- Early stopping: a trial's first run is at the scored level. A trial clearly behind the best
  finished trial stops there. The rest get the whole curve `repeat` times.
- Then the two leaders get more runs, until Welch's test separates them. Or until the
  `search.confirm` runs are spent, or the restart budget is. A tie is reported as one.
- The ledger is the memory. Bench rows carry the campaign's id as their sweep_id. Every finished
  trial is a `trials` row. So `--resume ID` refits the model on them and measures nothing twice.
  The campaign holds each host's deploy lock from its first deploy to its last.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from orchestrator import ledger
from orchestrator.errors import InputError, Interrupted, OrchestratorError
from orchestrator.hosts import deploy as deploy_mod
from orchestrator.hosts import preflight_play, runner
from orchestrator.hosts.runner import TaskEvent
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch
from orchestrator.tuning import bench as bench_mod
from orchestrator.tuning import objective as objective_mod
from orchestrator.tuning import outcome as outcome_mod
from orchestrator.tuning import scores as scores_mod
from orchestrator.tuning import search as search_mod
from orchestrator.tuning import space as space_mod
from orchestrator.tuning import stats, surrogate
from orchestrator.tuning import sweep as sweep_mod
from orchestrator.tuning.outcome import LevelBest, Outcome, Trial

__all__ = ["Campaign", "LevelBest", "Options", "Outcome", "Status", "Trial", "estimate"]

#: How long a campaign's host lock lasts after its latest deploy: longer than any trial's bench,
#: so no other deploy takes a host between two trials; a campaign that died on this control
#: machine leaves a lock that the next deploy from here takes over at once (a dead PID).
LOCK_TTL_S = 4 * 3600.0


#: The first SGLang with --speculative-adaptive.
ADAPTIVE_FROM = (0, 5, 23)


def adaptive_why_not(x: space_mod.Expanded) -> str:
    """'' when a campaign of this space also measures SGLang's adaptive mode, else why not."""
    base = x.base
    version = tuple(int(re.sub(r"\D.*", "", p) or 0) for p in base.server.sglang_version.split(".")[:3])
    if version < ADAPTIVE_FROM:
        return f"SGLang {base.server.sglang_version} has no --speculative-adaptive (0.5.23 has)"
    if base.speculative.algorithm not in ("EAGLE", "EAGLE3", "NEXTN"):
        return f"it needs EAGLE, EAGLE3 or NEXTN, not {base.speculative.algorithm}"
    if any(k.startswith("speculative.adaptive") for k in x.space.vary):
        return "the space varies speculative.adaptive itself"
    if x.space.traffic.request_rate or len(x.space.traffic.concurrency) < 2:
        return "its tiers are batch sizes: the traffic needs two concurrency levels or more"
    return ""


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


class _Stop(Exception):
    """Ctrl-C seen between two bench runs."""


#: how long a restart waits for hosts still choosing theirs, to share its play
GATHER_S = 2.0


@dataclass
class _Play:
    assign: dict[str, profile_mod.Profile] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)
    result: dict[str, str] = field(default_factory=dict)
    error: BaseException | None = None


class _Gather:
    """Restarts asked for together run as one play.

    One ansible-playbook process then restarts several hosts, as `deploy --limit` does: one
    process's start-up instead of one per host, and Ansible's own forks. The first host to ask
    waits while other hosts are still choosing their next point (at most GATHER_S), then runs
    the play for every host that joined. A host that will not restart says so (`done`)."""

    def __init__(
        self,
        play: Callable[[dict[str, profile_mod.Profile]], dict[str, str]],
        stopped: Callable[[], bool] = lambda: False,
    ):
        self.play = play
        self.stopped = stopped
        self.cond = threading.Condition()
        #: hosts choosing their next job, which may ask for a restart soon
        self.soon: set[str] = set()
        self.forming: _Play | None = None

    def expect(self, hosts: Iterable[str]) -> None:
        with self.cond:
            self.soon |= set(hosts)

    def done(self, host: str) -> None:
        with self.cond:
            self.soon.discard(host)
            self.cond.notify_all()

    def restart(self, host: str, prof: profile_mod.Profile) -> dict[str, str]:
        with self.cond:
            self.soon.discard(host)
            play, lead = self.forming, self.forming is None
            if play is None:
                play = self.forming = _Play()
            play.assign[host] = prof
            self.cond.notify_all()
            if lead:
                end = time.monotonic() + GATHER_S
                while self.soon and (left := end - time.monotonic()) > 0:
                    self.cond.wait(left)
                self.forming = None  # closed: who asks next starts another play
        if lead:
            try:
                if self.stopped():  # Ctrl-C while it gathered: no play starts after it
                    raise _Stop
                play.result = self.play(dict(play.assign))
            except BaseException as exc:  # every host of the play sees it
                play.error = exc
            finally:
                play.done.set()
        else:
            play.done.wait()
        if play.error is not None:
            raise play.error
        return play.result


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
        self.levels = [settings_level(v) for v in expanded.traffic.levels()]
        self.level = settings_level(expanded.level())
        self.goal = goal_of(expanded)
        self.baseline = expanded.baseline
        self.by_key = {p.key: p for p in expanded.points}
        self.scores = scores_mod.Scores(expanded, self.levels, self.goal, self.rows)
        self.search = search_mod.Search(expanded, self.scores.shapes)
        self.trials: list[Trial] = []
        #: host -> the profile it runs now (None: unknown, after a failed deploy)
        self.deployed: dict[str, profile_mod.Profile | None] = dict.fromkeys(self.hosts)
        self.lock = threading.RLock()
        self.stop = threading.Event()
        #: why this process stopped holding the campaign ("": it holds it)
        self.lost = ""
        self.running: dict[str, str] = {}
        self.started = time.monotonic()
        self.phase = ""
        self.durations: list[float] = []
        #: curve ids of the runs that count (rows())
        self.curves: set[str] = set()
        #: point keys in flight, and restarts reserved by trials in flight
        self.pending: set[str] = set()
        self.reserved = 0
        self.baseline_host: str | None = None
        #: why SGLang's adaptive mode is not measured ("": it is, with one restart kept for it)
        self.adaptive_skip = adaptive_why_not(expanded)
        self.adaptive_reserve = 0 if self.adaptive_skip else 1
        #: restarts the search leaves for the leaders' confirmation and the adaptive mode
        self.reserve = confirm_reserve(expanded.space) + self.adaptive_reserve
        self.gather = _Gather(self._deploy, self.stop.is_set)

    # ---- ledger

    def rows(self) -> list[Any]:
        """The campaign's bench runs that count: those of recorded trials and of the ones in
        flight (a trial cut off by Ctrl-C left runs that a resumed campaign measures anew)."""
        with self.lock:
            curves = set(self.curves)
        rows = []
        for r in ledger.bench_results(sweep_id=self.id):
            if r["curve_id"] not in curves:
                continue
            if r["result"] == "ok" and not (r["tok_s"] is not None and r["tok_s"] > 0):
                ledger.note_skipped(
                    "bench_results", r, f"tok_s holds {r['tok_s']!r}: a run measures some speed"
                )
                continue
            rows.append(r)
        return rows

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
        with self.lock:
            best = self._ranked()[:1]
            done = [t for t in self.trials if t.kind == "trial"]
            eta = None
            if self.durations:
                per = statistics.fmean(self.durations)
                eta = max(0, self.budget - self.restarts_used) * per / max(1, len(self.hosts))
            status = Status(
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
        self.options.on_status(status)

    # ---- set-up

    def _start(self) -> None:
        role = self.x.base.disaggregation
        if role is not None:
            raise InputError(
                f"{self.x.base.name} is a {role.mode} server of a prefill/decode fleet: "
                "tune benches each host alone, and a PD server serves only in a pair; a campaign through "
                "the PD gateway is not built yet (docs/pd.md)"
            )
        ledger.ready()  # before any host changes: every trial must be recorded
        self._winner_folder()
        row = None
        if not self.resumed:
            problem = budget_problem(self.x)
            if problem:
                raise InputError(problem)
        else:
            row = ledger.campaign(self.id)
            if row is None:
                raise InputError(
                    f"no campaign {self.id} in the ledger ({ledger.shown()}): check the id "
                    "(`results` shows each bench row's sweep_id)"
                )
            if row["space_digest"] != self.x.digest:
                raise InputError(
                    f"{self.x.path} is not the file campaign {self.id} began with (digest {self.x.digest}, "
                    f"campaign's {row['space_digest']}): resume with that file, or start a new campaign"
                )
            # Before any play: refused while another process runs it, from any machine.
            ledger.claim_campaign(self.id)
        self._same_files()
        if row is not None:
            if not self.hosts:
                self.hosts = self._hosts_of(row)
                self.deployed = dict.fromkeys(self.hosts)
            self._replay()
            self._check_unchanged()
            self._running_now()
            ledger.update_campaign(self.id, status="running", hosts=json.dumps(self.hosts))
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

    def _same_files(self) -> None:
        """Before the first stop: the baseline's model and drafter files are the same on every host
        (preflight_play.FilesDiffer names a host whose files differ). Two drafters measured on two
        hosts would read as host noise."""
        if len(self.hosts) < 2:
            return
        checked: set[tuple[str, str]] = set()
        for prof in [self.x.base, *(p.profile for p in self.x.valid if p.profile is not None)]:
            files = (prof.server.model_path, prof.speculative.draft_model_path or "")
            if files in checked or (not files[1] and prof is self.x.base and self.x.valid):
                continue  # a trial names the drafter: its check covers the model too
            checked.add(files)
            preflight_play.require_same_files_on(prof, self.inventory, self.hosts)

    def _hosts_of(self, row: Any) -> list[str]:
        """The hosts a campaign ran on, as its row holds them (a JSON list of names)."""
        try:
            hosts = json.loads(row["hosts"])
        except ValueError:
            hosts = None
        if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) and h for h in hosts):
            raise InputError(
                f"campaign {self.id}: its hosts column holds {row['hosts']!r}, not a JSON list of host "
                "names: give --limit HOSTS, or correct the row"
            )
        return hosts

    def _point_of(self, r: Any) -> tuple[dict[str, Any], space_mod.Point | None] | None:
        """A trial row's point, or None (noted, skipped) when the row cannot be one of this space."""
        why = ""
        try:
            params = json.loads(r["point"])
        except ValueError:
            params = None
        if r["kind"] not in ("baseline", "trial", "confirm", "adaptive"):
            why = f"kind holds {r['kind']!r}, not baseline, trial, confirm or adaptive"
        elif not isinstance(params, dict):
            why = f"point holds {r['point']!r}, not a JSON object of the space's fields"
        elif r["kind"] == "baseline":
            return params, None
        elif r["kind"] == "adaptive":
            params = _adaptive_params(params)
            found = space_mod.derived(self.x, params)
            if found.profile is not None:
                return params, found
            why = f"point holds {r['point']!r}, which this space does not make: {found.pruned}"
        else:
            point = self.by_key.get(space_mod.point_key(params))
            if point is not None and point.profile is not None:
                return params, point
            why = f"point holds {r['point']!r}, not a valid point of this space"
        ledger.note_skipped("trials", r, why)
        return None

    def _replay(self) -> None:
        """The finished trials of the campaign so far, as they were recorded (a row that cannot be
        one is skipped with a note: its point is measured again)."""
        measured = {
            r["curve_id"]
            for r in ledger.bench_results(sweep_id=self.id)
            if sweep_mod.measured(r) and r["tok_s"] > 0
        }
        for r in ledger.trials(self.id):
            found = self._point_of(r)
            if found is None:
                continue
            if r["state"] in ("complete", "stopped", "infeasible") and r["curve_id"] not in measured:
                why = f"state holds {r['state']!r}, but no run of its curve measured anything"
                ledger.note_skipped("trials", r, why)
                continue
            params, point = found
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
                predicted=r["predicted"],
            )
            self.curves.add(r["curve_id"])
            self.trials.append(trial)
            if trial.kind == "baseline" and trial.state == "complete":
                self.baseline_host = trial.host

    def _check_unchanged(self) -> None:
        """Every finished trial still renders the unit it ran. A profile the space extends, or a
        file a profile names, may have changed since: its old runs would be scored as the new
        point, and that winner deployed."""
        ran: dict[str, set[str]] = {}
        levels: dict[str, set[sweep_mod.Level]] = {}
        for r in self.rows():
            if r["plan_digest"]:
                ran.setdefault(r["curve_id"], set()).add(r["plan_digest"])
            if sweep_mod.measured(r):
                levels.setdefault(r["curve_id"], set()).add(sweep_mod.level_of(r))
        for t in self.trials:
            if levels.get(t.curve_id) and not levels[t.curve_id] & set(self.levels):
                raise InputError(
                    f"campaign {self.id}: {t.label} was measured with other traffic than "
                    f"{self.x.path} gives now (its dataset file, or what a level is, changed since): put "
                    "the old dataset back to resume, or start a new campaign"
                )
        for t in self.trials:
            digests = ran.get(t.curve_id, set())
            now = launch.build(t.profile).digest
            if digests and now not in digests:
                raise InputError(
                    f"campaign {self.id}: {t.label} ran a unit of digest {sorted(digests)[0]}, and "
                    f"{self.x.path} now renders {now} for it (a profile it extends, or a file one names, "
                    "changed since): put the old files back to resume, or start a new campaign"
                )

    def _running_now(self) -> None:
        """After --resume: what each host runs, where its last deploy was one of this campaign's
        profiles and the unit is still that one (else unknown: None)."""
        by_name = {t.profile.name: t.profile for t in self.trials} | {self.baseline.name: self.baseline}
        for host in self.hosts:
            unit = self.baseline.service.unit_name
            last = next((r for r in ledger.history(host, 20) if r["unit_name"] == unit), None)
            if last is None or last["result"] not in ("healthy", "unchanged"):
                continue
            prof = by_name.get(last["profile"])
            if prof is not None and last["digest"] == launch.build(prof).digest:
                self.deployed[host] = prof

    def _stopped(self, where: str) -> str:
        if self.lost:
            return (
                f"tune campaign {self.id} stopped{where}: {self.lost}; its finished trials are in the ledger"
            )
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

    def _session(self, host: str) -> Any:
        """The bench target (the deployed plan) and a journal reader of `host`."""
        prof = self.deployed[host]
        assert prof is not None
        reader = bench_mod.journal_lines(self.inventory, host, prof.service.unit_name)
        return bench_mod.deployed_target(self.inventory, host, prof), reader

    def _bench(self, trial: Trial, first_look: bool) -> None:
        """The trial's traffic on its host: the scored level first (one run: the first look, which
        may stop it), then every level `repeat` times. Fills trial.state and trial.value.

        The journal is read once, after the last run, and each run takes the lines of its own
        window: one play per trial instead of one per run (each is an ansible-playbook process,
        which the lab's few cores feel when several hosts bench at once)."""
        target, log = self._session(trial.host)
        traffic = self.x.traffic
        levels = traffic.levels()
        scored = next(s for s in levels if settings_level(s) == self.level)
        order = [(scored, 0)] + [
            (s, k) for s in levels for k in range(traffic.repeat) if (s, k) != (scored, 0)
        ]
        if trial.kind == "confirm":
            order = [(scored, 0)] if self.goal.kind != "goodput" else [(s, 0) for s in levels]
        curve_id = trial.curve_id = uuid.uuid4().hex[:12]
        with self.lock:
            self.curves.add(curve_id)
        base_row = {
            "sweep_id": self.id,
            "profile": trial.profile.name,
            "speculative": int(trial.profile.speculative.algorithm is not None),
        }
        done: dict[int, bench_mod.BenchResult] = {}  # ledger id -> the run
        read = True  # Ctrl-C or a crash: the runs stand without a last play
        try:
            for i, (settings, k) in enumerate(order):
                if self.stop.is_set():
                    raise _Stop
                self.running[trial.host] = f"{trial.label}: bench {settings.level} ({i + 1}/{len(order)})"
                self._status()
                try:
                    result = bench_mod.run(target, settings, None, log_later=True)
                except OrchestratorError as exc:
                    sweep_mod._record_failure(
                        base_row, uuid.uuid4().hex[:12], trial.host, f"bench failed: {exc}", settings
                    )
                    trial.state, trial.diagnosis = "failed", f"{trial.host}: bench failed: {exc}"
                    return
                result.curve_id, result.repeat = curve_id, k
                # in the ledger at once: the model fits it while the trial goes on, on other hosts too
                done[bench_mod.record(result, self.id)] = result
                if i == 0 and first_look and self._behind(trial):
                    return
        except BaseException:
            read = False
            raise
        finally:
            if read:
                self._read_log(done, log)
        self._score(trial)

    def _read_log(
        self, done: Mapping[int, bench_mod.BenchResult], log: Callable[[float], list[tuple[float, str]]]
    ) -> None:
        """The trial's runs' accept lengths from one journal read, and their notes, into their rows."""
        lines: list[tuple[float, str]] = []
        unread = ""
        if any(r.speculative for r in done.values()):
            try:
                lines = log(min(r.began_epoch for r in done.values()))
            except OrchestratorError as exc:  # the runs stand without the log's cross-check
                unread = str(exc)
        for row_id, r in done.items():
            bench_mod.logged(r, lines, unread)
            row = r.row(self.id)
            ledger.update_bench(row_id, accept_len_log=row["accept_len_log"], notes=row["notes"])

    def _behind(self, trial: Trial) -> bool:
        """The first look: stop a trial whose first run trails the best finished trial by more than
        the margin (three run-to-run standard deviations, at least 2%)."""
        if trial.kind != "trial" or not self.x.space.search.early_stop or not self.goal.early_stop:
            return False
        value = self.scores.value(trial.profile.name)
        with self.lock:
            done = [t.value for t in self.trials if t.kind == "trial" and t.state == "complete" and t.value]
        if value is None or not done or value >= max(done) * (1.0 - self.scores.margin()):
            return False
        trial.state, trial.value = "stopped", value
        return True

    def _score(self, trial: Trial) -> None:
        rows = self.rows()
        if trial.kind == "baseline":
            mine = [r for r in rows if r["curve_id"] == trial.curve_id and sweep_mod.measured(r)]
            if not any(sweep_mod.level_of(r) == self.level for r in mine):
                trial.state = "failed"
                trial.diagnosis = f"{trial.host}: the baseline measured nothing at {self.level.load}"
                return
            trial.state = "complete"
            trial.value = 1.0
            return
        if not any(r["curve_id"] == trial.curve_id and sweep_mod.measured(r) for r in rows):
            trial.state, trial.diagnosis = "failed", f"{trial.host}: no run measured anything"
            return
        trial.value = self.scores.value(trial.profile.name, rows)
        means = self.scores.means(rows, trial.profile.name, self.scores.fit(rows))
        why = self.goal.feasible({c: v for (i, c), v in means.items() if i == self.goal.level})
        trial.state, trial.diagnosis = ("infeasible", why) if why else ("complete", "")

    # ---- the hosts' work

    def _measured(self) -> dict[str, Trial]:
        """Point key -> its finished trial (the search measures nothing twice)."""
        return {space_mod.point_key(t.params): t for t in self.trials if t.kind == "trial"}

    def _have_baseline(self) -> bool:
        return any(t.kind == "baseline" and t.state == "complete" for t in self.trials)

    def _next_job(self, host: str) -> Trial | None:
        """What `host` does next: the baseline where none is measured or measuring, else the
        search's next point; None when the budget or the space is spent. Reserves its restart."""
        with self.lock:
            free = self.budget - self.restarts_used - self.reserved - self.reserve
            baseline_busy = "baseline" in self.pending
            if not self._have_baseline() and not baseline_busy:
                if self.budget - self.restarts_used - self.reserved <= 0:
                    return None
                self.pending.add("baseline")
                self.reserved += 1
                return Trial(-1, "baseline", {}, self.baseline, host)
            if free <= 0:
                return None
            self.reserved += 1  # before the fit: another host asking meanwhile sees it spent
            done = set(self._measured())
            pending = set(self.pending)
        try:
            fit = ctx = best = None
            # the model chooses once the spread points are in flight and the baseline is measured:
            # every gain it predicts is against the baseline, which it would otherwise extrapolate
            started = (
                len(done) + len(pending) >= self.search.settings.startup_trials and self._have_baseline()
            )
            if self.search.settings.sampler == "model" and started:
                rows = self.rows()
                fit = self.scores.fit(rows, boots=surrogate.BOOTSTRAP)
                if fit is not None:
                    ctx = self.scores.context(rows, fit, self._model_error())
                    ranked = self._ranked(rows)
                    best = ranked[0].value if ranked else None
            with self.lock:
                found = self.search.next(set(self._measured()), set(self.pending), fit, ctx, best)
                if found is None:
                    self.reserved -= 1
                    return None
                point, guess = found
                assert point.profile is not None
                self.pending.add(point.key)
                number = len([t for t in self.trials if t.kind == "trial"]) + len(self.pending) - 1
        except BaseException:
            with self.lock:
                self.reserved -= 1
            raise
        return Trial(
            number, "trial", dict(point.params), point.profile, host, predicted=guess.mean if guess else None
        )

    def _work(self, host: str) -> None:
        """One host's loop: take a job, deploy it, bench it, record it; until none is left."""
        while not self.stop.is_set():
            if host not in self.hosts:
                return
            self.gather.expect([host])
            t = self._next_job(host)
            if t is None:
                return
            key = "baseline" if t.kind == "baseline" else space_mod.point_key(t.params)
            try:
                if self.stop.is_set():  # Ctrl-C while this host chose: no new restart
                    return
                self._trial(t)
            finally:
                with self.lock:
                    self.pending.discard(key)
                    self.reserved -= 1

    def _trial(self, t: Trial) -> None:
        begun = time.monotonic()
        self.running[t.host] = f"{t.label}: deploy"
        self._status()
        outcome = self.gather.restart(t.host, t.profile)
        t.restarted = bool(outcome.get(t.host + "\0restarted"))
        t.startup = outcome.get(t.host + "\0startup", "")
        if outcome[t.host]:
            t.state, t.diagnosis = "failed", outcome[t.host]
        elif self.stop.is_set():
            raise _Stop
        else:
            self._bench(t, first_look=True)
        self.running.pop(t.host, None)
        if t.kind == "baseline" and t.state != "complete":
            with self.lock:  # a host that cannot measure the baseline is not one to compare on
                self.hosts.remove(t.host)
        self._record(t)
        self.durations.append(time.monotonic() - begun)
        self._status()

    def _run_hosts(self, work: Callable[[str], None], hosts: Sequence[str]) -> None:
        """`work` on each host at once. Ctrl-C lets each host end what it does (a deploy, a bench
        run), records the trials that finished and raises Interrupted; a trial cut off mid-bench
        is not recorded (its runs never count: rows())."""
        if not hosts:
            return

        def each(host: str) -> None:
            try:
                work(host)
            finally:
                self.gather.done(host)

        self.gather.expect(hosts)  # every host may restart at once: one play for them
        with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
            futures: dict[Future[None], str] = {pool.submit(each, h): h for h in hosts}
            pending = set(futures)
            crashed: BaseException | None = None
            try:
                while pending:
                    done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                    for f in done:
                        try:
                            f.result()
                        except _Stop:
                            continue
                        except KeyboardInterrupt:
                            raise
                        except Exception as exc:  # one host's crash stops the others' next trial
                            self.stop.set()
                            crashed = crashed or exc
            except KeyboardInterrupt:
                self.stop.set()
                runner.cancel_plays()  # a host's deploy stops too, and puts back what it changed
                where = " while benching"
                for f in pending:
                    try:
                        f.result()
                    except (_Stop, KeyboardInterrupt):
                        continue
                    except Interrupted:
                        where = " while deploying (hosts it changed were rolled back)"
                    except Exception as exc:  # a host's own error, seen while stopping: named, resumable
                        where += f" (a host also failed: {exc})"
                raise Interrupted(self._stopped(where)) from None
        if crashed is not None:
            raise crashed
        if self.stop.is_set():
            raise Interrupted(self._stopped(""))

    def _search(self) -> None:
        self.phase = "search"
        self._run_hosts(self._work, list(self.hosts))
        if not self._have_baseline():
            lost = [t for t in self.trials if t.kind == "baseline"]
            raise OrchestratorError(
                "no host measured the baseline, so no trial could be scored: "
                + ("; ".join(t.diagnosis for t in lost) or "the budget ran out first")
            )

    def _ranked(self, rows: Sequence[Any] | None = None) -> list[Trial]:
        """Complete trials, best first (a point's value from every run of it, confirmations too)."""
        rows = self.rows() if rows is None else rows
        best: dict[str, Trial] = {}
        with self.lock:
            for t in self.trials:
                if t.kind == "trial" and t.state == "complete" and t.value is not None:
                    best[t.profile.name] = t
        for t in best.values():
            t.value = self.scores.value(t.profile.name, rows) or t.value
        return sorted(best.values(), key=lambda t: -(t.value or 0.0))

    def _confirm(self) -> str:
        """More runs of the two leaders at the scored level until Welch's test separates them:
        'separated', 'tie' (the test ran and found them within noise), or '' (fewer than two
        leaders, or too few runs to test)."""
        extra = self.x.space.search.confirm
        self.phase = "confirm"
        for _ in range(extra + 1):
            ranked = self._ranked()
            if len(ranked) < 2:
                return ""
            a, b = ranked[0], ranked[1]
            mine, theirs = self.scores.samples(a.profile.name), self.scores.samples(b.profile.name)
            if not mine or not theirs:  # a leader without runs at the scored level: nothing to compare
                return ""
            found = stats.compare(mine, theirs)
            if found.verdict in ("faster", "slower"):
                return "separated"
            tested = "tie" if found.verdict == "within noise" else ""
            done = sum(
                1
                for t in self.trials
                if t.kind == "confirm" and t.profile.name in (a.profile.name, b.profile.name)
            )
            if done >= 2 * extra or self.stop.is_set():
                return tested
            assign: dict[str, Trial] = {}
            extra_runs = {
                t.profile.name: sum(
                    1 for x in self.trials if x.kind == "confirm" and x.profile.name == t.profile.name
                )
                for t in (a, b)
            }
            # with one host free, the leader with fewer extra runs has it: both get their turn
            for leader in sorted((a, b), key=lambda t: extra_runs[t.profile.name]):
                host = next(
                    (
                        h
                        for h, p in self.deployed.items()
                        if p is not None
                        and p.name == leader.profile.name
                        and h not in assign
                        and h in self.hosts
                    ),
                    None,
                )
                restart = host is None
                if host is None:
                    host = next((h for h in self.hosts if h not in assign), None)
                    if (
                        host is None
                        or self.restarts_used + sum(x.restarted for x in assign.values())
                        >= self.budget - self.adaptive_reserve
                    ):
                        continue
                assign[host] = Trial(
                    leader.number, "confirm", leader.params, leader.profile, host, restarted=restart
                )
            if not assign:
                return tested
            jobs = dict(assign)

            def confirm_one(host: str, jobs: dict[str, Trial] = jobs) -> None:
                self._confirm_one(jobs[host])

            self._run_hosts(confirm_one, list(jobs))
        ranked = self._ranked()
        if len(ranked) < 2:
            return ""
        last = stats.compare(
            self.scores.samples(ranked[0].profile.name), self.scores.samples(ranked[1].profile.name)
        )
        return {"faster": "separated", "slower": "separated", "within noise": "tie"}.get(last.verdict, "")

    def _confirm_one(self, t: Trial) -> None:
        """A leader's extra runs: where it still runs, a bench only; elsewhere a deploy first."""
        if not t.restarted:
            self.gather.done(t.host)
        else:
            outcome = self.gather.restart(t.host, t.profile)
            if outcome[t.host]:
                t.state, t.diagnosis = "failed", outcome[t.host]
                self._record(t)
                return
        self._bench(t, first_look=False)
        self.running.pop(t.host, None)
        if t.state != "failed":
            t.state = "complete"
        self._record(t)

    # ---- outcome

    def _levels(self, top: int = 3) -> list[tuple[sweep_mod.Level, list[LevelBest]]]:
        """Per level of the traffic: the baseline's row, then the `top` fully measured trials by
        their gain over the baseline at that level (the objective's metric there; goodput ranks
        by tok/s at each level)."""
        rows = self.rows()
        fit = self.scores.fit(rows)
        full = {
            t.profile.name: t
            for t in self.trials
            if t.kind == "trial" and t.state in ("complete", "infeasible")
        }
        base = self.scores.means(rows, self.baseline.name, fit)
        column = self.goal.metric if self.goal.kind != "goodput" else "tok_s"
        out = []
        for i, level in enumerate(self.levels):
            scored = []
            for name in full:
                mine = self.scores.means(rows, name, fit)
                gain = objective_mod.ratio(column, mine.get((i, column)), base.get((i, column)))
                if gain is not None:
                    scored.append((gain, name))
            scored.sort(reverse=True)
            entries = [self._level_row(rows, fit, i, self.baseline.name, "baseline", base, column)]
            entries += [
                replace(
                    self._level_row(rows, fit, i, name, full[name].label, base, column),
                    feasible=full[name].state != "infeasible",
                )
                for _, name in scored[:top]
            ]
            out.append((level, entries))
        return out

    def _level_row(
        self,
        rows: list[Any],
        fit: surrogate.Fit | None,
        i: int,
        name: str,
        label: str,
        base: Mapping[tuple[int, str], float],
        column: str,
    ) -> LevelBest:
        level = self.levels[i]
        runs = [
            r
            for r in rows
            if r["profile"] == name and sweep_mod.measured(r) and sweep_mod.level_of(r) == level
        ]
        tok = [float(r["tok_s"]) for r in runs]
        accepts = [a for r in runs if (a := sweep_mod._level_accept(r)) is not None]
        mine = self.scores.means(rows, name, fit)
        gain = objective_mod.ratio(column, mine.get((i, column)), base.get((i, column)))

        def ms(c: str) -> float | None:
            v = [float(r[c]) * 1000 for r in runs if r[c] is not None]
            return statistics.fmean(v) if v else None

        total = [float(r["total_tok_s"]) for r in runs if r["total_tok_s"] is not None]
        return LevelBest(
            level,
            name,
            label,
            stats.interval(tok) if tok else None,
            gain,
            statistics.fmean(accepts) if accepts else None,
            ms("ttft_p99_s"),
            ms("itl_p99_s"),
            statistics.fmean(total) if total else None,
        )

    def _open_points(self) -> tuple[list[str], int]:
        """Unmeasured valid points the model cannot rule out beating the baseline, and how many
        valid points were never measured."""
        measured = self._measured()
        left = [p for p in self.x.valid if p.key not in measured]
        if not left:
            return [], 0
        rows = self.rows()
        fit = self.scores.fit(rows, boots=surrogate.BOOTSTRAP)
        if fit is None:
            return [p.label for p in left], len(left)
        ctx = self.scores.context(rows, fit, self._model_error())
        found = self.search.guesses(left, set(measured), fit, ctx)
        labels = {p.key: p.label for p in left}
        return outcome_mod.open_points(found, labels, self.scores.margin()), len(left)

    def _errors(self) -> list[float]:
        """The model's error on each trial it chose, as a fraction of the measured gain."""
        with self.lock:
            chosen = [t for t in self.trials if t.kind == "trial" and t.predicted is not None and t.value]
        return [abs(t.predicted - t.value) / t.value for t in chosen if t.predicted is not None and t.value]

    def _model_error(self) -> float:
        errors = self._errors()
        return statistics.fmean(errors) if errors else 0.0

    def _model_report(self) -> outcome_mod.ModelReport:
        errors = self._errors()
        fit = self.scores.fit()
        return outcome_mod.ModelReport(
            statistics.fmean(errors) if errors else None,
            len(errors),
            fit.hosts if fit else {},
            fit.accept if fit else None,
        )

    def _tiers(self, levels: Sequence[tuple[sweep_mod.Level, Sequence[LevelBest]]]) -> dict[int, list[int]]:
        """Batch size -> the steps of the best static setting at each concurrency (0: the baseline
        wins there); a level's tier starts at the geometric midpoint from the level below.
        SGLang's adaptive tiers draft a chain (top-k 1, steps + 1 tokens), so a winner's tree
        keeps its depth and loses its width."""
        names = {t.profile.name: t.profile for t in self.trials}
        tiers: dict[int, list[int]] = {}
        for level, rows in levels:
            best = outcome_mod.best_row(rows)
            if best is None:
                continue
            prof = names.get(best.profile)
            steps = 0
            if prof is not None and prof.speculative.algorithm is not None:
                steps = int(prof.speculative.num_steps or surrogate.AUTO_STEPS)
            tiers[level.concurrency] = [steps]
        # a tier serves batch sizes from its key up to the next key; batches between two measured
        # levels go to the nearer one on a log scale (the geometric midpoint), not all to the lower
        sizes = sorted(tiers)
        keyed = {sizes[0]: tiers[sizes[0]]}
        for low, high in itertools.pairwise(sizes):
            keyed[max(low + 1, round(math.sqrt(low * high)))] = tiers[high]
        return keyed

    def _adaptive(
        self, levels: Sequence[tuple[sweep_mod.Level, Sequence[LevelBest]]]
    ) -> outcome_mod.AdaptiveReport | None:
        """SGLang's adaptive mode with tiers from the per-level winners: one restart, the whole
        curve, then each level against its best static setting."""
        if self.adaptive_skip:
            return outcome_mod.AdaptiveReport({}, "", skipped=self.adaptive_skip)
        tiers = self._tiers(levels)
        report = outcome_mod.AdaptiveReport(tiers, "")
        if not any(s for steps in tiers.values() for s in steps):
            report.skipped = "the baseline is best at every level: no tier would draft"
            return report
        params = _adaptive_params(
            {
                "speculative.num_steps": None,
                "speculative.eagle_topk": None,
                "speculative.num_draft_tokens": None,
                "speculative.adaptive": {"tiers": tiers},
            }
        )
        point = space_mod.derived(self.x, params)
        if point.profile is None:
            report.skipped = f"its profile is refused: {point.pruned}"
            return report
        report.profile = point.name
        done = next((t for t in self.trials if t.kind == "adaptive" and t.profile.name == point.name), None)
        if done is None:
            if self.restarts_used >= self.budget:
                report.skipped = "no restart left in the budget"
                return report
            self.phase = "adaptive"
            host = next(
                (h for h, p in self.deployed.items() if p is not None and h in self.hosts), self.hosts[0]
            )
            job = Trial(-2, "adaptive", params, point.profile, host)

            def measure(h: str) -> None:
                self._trial(job)

            self._run_hosts(measure, [host])
            done = job
        if done.state not in ("complete", "infeasible"):
            report.skipped = f"it failed: {done.diagnosis}"
            return report
        rows = self.rows()
        fit = self.scores.fit(rows)
        column = self.goal.metric if self.goal.kind != "goodput" else "tok_s"
        flip = column in objective_mod.TIMES  # a time: lower is better

        def runs(name: str, level: sweep_mod.Level) -> list[float]:
            found = [v for _, v in self.scores.runs(rows, name, level, column, fit)]
            return [1.0 / v for v in found if v > 0] if flip else found

        for level, rows_at in levels:
            best = outcome_mod.best_row(rows_at)
            if best is None:
                continue
            mine, theirs = runs(point.name, level), runs(best.profile, level)
            if not mine or not theirs:
                continue
            found = stats.compare(mine, theirs)
            words = {
                "faster": "beats",
                "slower": "loses to",
                "within noise": "is within noise of",
                "too few runs": "has too few runs against",
            }[found.verdict]
            label = "the baseline" if best.profile == self.baseline.name else best.label
            report.levels.append((level.load, label, words, found.ratio))
        return report

    def _verdict(self, winner: Trial | None) -> tuple[str, bool, list[str]]:
        rows = self.rows()
        mine = self.scores.samples(winner.profile.name, rows) if winner else []
        base = self.scores.samples(self.baseline.name, rows)
        fit = self.scores.fit(rows)
        means = self.scores.base(rows, fit)
        if self.goal.kind == "goodput":
            top = max(scores_mod.load_of(level) for level in self.levels)
            if (means.get((-1, "goodput")) or 0.0) >= top:
                return (
                    "over the curve the baseline keeps the limits up to the highest load measured "
                    f"({top:g}): no trial can show more goodput; add higher levels to the traffic to tell",
                    False,
                    [],
                )
        if winner is None:
            over = [t for t in self.trials if t.kind == "trial" and t.state == "infeasible"]
            if over:
                return (
                    f"{len(over)} trial(s) measured, every one breaks the objective's limits (e.g. "
                    f"{over[0].label}: {over[0].diagnosis}): no winner",
                    False,
                    [],
                )
        text, beats = outcome_mod.verdict(self.goal, self.level, winner, mine, base, [], 0)
        still: list[str] = []
        if winner is not None and not beats:
            still, left = self._open_points()
            text, beats = outcome_mod.verdict(self.goal, self.level, winner, mine, base, still, left)
        why = self.goal.feasible({c: v for (i, c), v in means.items() if i == self.goal.level})
        if why:
            text += f"; the baseline itself breaks the limits ({why})"
        return text + self._against_incumbent(winner), beats, still

    def _against_incumbent(self, winner: Trial | None) -> str:
        """How the space's own profile (measured first where the space holds its point) did, when
        it is not the winner: what the campaign gained over what ran before it."""
        first = self.x.incumbent
        if winner is None or first is None or first.key == space_mod.point_key(winner.params):
            return f"; it is {self.x.base.name}'s own setting" if winner is not None and first else ""
        t = self._measured().get(first.key)  # its value from every run: _phases ranked it
        if t is None:
            return ""
        how = {"stopped": ", stopped early", "infeasible": f", {t.diagnosis}"}.get(t.state, "")
        if t.value is None:
            return f"; {self.x.base.name}'s own setting ({t.label}): {t.state}"
        return f"; {self.x.base.name}'s own setting ({t.label}): {self.goal.words(t.value)}{how}"

    def _winner_folder(self) -> tuple[Path, str]:
        """Where the winner's file goes, and how a message names it; checked at the start, so
        that a campaign never ends with nowhere to write."""
        if self.options.profiles_dir is not None:
            folder, named = self.options.profiles_dir, str(self.options.profiles_dir)
        else:
            folder, named = profile_mod.profiles_dir()
        for there in (folder, *folder.parents):
            try:
                if not there.exists():
                    continue
                if not there.is_dir():
                    raise InputError(
                        f"the winner's profile file goes in {named}, but {there} is not a folder: "
                        "name a folder with --profiles-dir or ORCHESTRATOR_PROFILES"
                    )
            except OSError as exc:
                raise InputError(f"the winner's profile folder {named}: {exc.strerror or exc}") from None
            break
        return folder, named

    def _write_winner(self, winner: Trial, summary: str) -> str:
        """The winner as a new profile file beside the others: the space's profile with the chosen
        fields; never over an existing file. The path, or '' when there is nowhere to write."""
        folder, _ = self._winner_folder()
        folder.mkdir(parents=True, exist_ok=True)
        stem = f"{self.x.base.name}-tuned-{self.id[:6]}"
        path = folder / f"{stem}.yml"
        n = 2
        while path.exists():
            path, n = folder / f"{stem}-{n}.yml", n + 1
        extends = self.x.space.extends
        if "/" in extends or extends.endswith((".yml", ".yaml")):
            import os

            # from where the file really lies: a profiles folder may be a link elsewhere
            extends = os.path.relpath(
                Path(profile_mod._parent_ref(extends, self.x.path)).resolve(), folder.resolve()
            )
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
        try:
            profile_mod.load(str(path))  # it must validate, as every trial did
        except OrchestratorError:
            path.unlink(missing_ok=True)  # no file that does not load is left as the winner
            raise
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
        touched = {t.host for t in self.trials} | {h for h, p in self.deployed.items() if p is not None}
        hosts = self.hosts if prof is not None else [h for h in self.hosts if h in touched]
        assign = {h: prof or self.deployed.get(h) or self.baseline for h in hosts}
        outcome.left = prof.name if prof else "as it was (--leave none)"
        if not assign:  # --leave none, and no host was deployed: nothing to put back, no lock held
            outcome.left_ok = True
            return
        unknown = [h for h in hosts if prof is None and self.deployed.get(h) is None]
        if unknown:  # a deploy releases the campaign's lock: where nothing known runs, the baseline
            outcome.left += f"; the baseline on {', '.join(unknown)}, whose unit was not known"
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
        """The search on every host, the leaders' extra runs; the outcome, the winner's file and
        what is left deployed."""
        self._search()
        leaders = self._confirm()
        if self.restarts_used < self.budget - self.adaptive_reserve and len(self._measured()) < len(
            self.x.valid
        ):
            # the leaders ran where they still ran, and left their restart: search with it
            self.reserve = self.adaptive_reserve
            self._search()
            leaders = self._confirm()
        ranked = self._ranked()
        winner = ranked[0] if ranked else None
        verdict, beats, still = self._verdict(winner)
        levels = self._levels()
        handovers, line = outcome_mod.per_load(levels, self.baseline.name)
        adaptive = self._adaptive(levels)
        outcome = Outcome(
            self.id,
            str(self.x.path),
            self.hosts,
            self.trials,
            self.x.pruned,
            self.restarts_used,
            len(self.x.valid),
            levels,
            verdict,
            leaders,
            winner,
            beats,
            failures=[t for t in self.trials if t.state == "failed"],
            per_load=handovers,
            per_load_line=line,
            open_points=still,
            model=self._model_report(),
            objective=self.goal.describe(self.level.load),
            adaptive=adaptive,
        )
        if winner is not None:
            try:
                outcome.winner_file = self._write_winner(winner, f"tuned: {verdict}")
            except (OSError, OrchestratorError) as exc:  # the outcome stands; the file is named missing
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                outcome.winner_error = f"the winner's profile file was not written: {why}"
        self._leave(outcome)
        return outcome

    def run(self) -> Outcome:
        with ledger.holding(self.id, on_lost=self._lost):
            return self._run()

    def _lost(self, why: str) -> None:
        """Another process runs the campaign now (or the ledger is gone): no new restart here."""
        self.lost = why
        self.stop.set()

    def _run(self) -> Outcome:
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
        except Exception:
            ledger.update_campaign(self.id, status="failed")
            raise
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
                    "per_load": outcome.per_load_line,
                }
            ),
        )
        return outcome


def _adaptive_params(params: dict[str, Any]) -> dict[str, Any]:
    """An adaptive trial's fields, its tiers' batch sizes as numbers (JSON wrote them as text)."""
    out = dict(params)
    adaptive = dict(out.get("speculative.adaptive") or {})
    if adaptive.get("tiers"):
        adaptive["tiers"] = {int(k): list(v) for k, v in adaptive["tiers"].items()}
        out["speculative.adaptive"] = adaptive
    return out


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
    #: points measured: the restarts left after the baseline (and the leaders' confirmation
    #: reserve), at most the valid points
    trials: int
    rounds: int
    restart_s: float
    #: one trial's bench: the whole curve, `repeat` runs per level
    bench_s: float
    wall_s: float
    #: where the figures come from
    basis: str


def goal_of(x: space_mod.Expanded) -> objective_mod.Goal:
    """The space's objective, at the level of the curve it scores."""
    levels = [settings_level(v) for v in x.traffic.levels()]
    return objective_mod.goal(x.space.objective, levels.index(settings_level(x.level())))


def budget_problem(x: space_mod.Expanded) -> str:
    """Why the budget measures nothing ('' when it measures a point): the run and --check say it
    alike. The baseline takes one restart; the leaders' confirmation and the adaptive mode keep
    theirs (trials_for)."""
    if trials_for(x, 1) > 0:
        return ""
    least = 2 + confirm_reserve(x.space) + (0 if adaptive_why_not(x) else 1)
    kept = []
    if confirm_reserve(x.space):
        kept.append("one for the leaders' confirmation (search.confirm)")
    if not adaptive_why_not(x):
        kept.append("one for SGLang's adaptive mode")
    return (
        f"{x.path}: budget.restarts {x.space.budget.restarts} measures no point: one restart is the "
        f"baseline{''.join('; ' + k for k in kept)}: raise it to at least {least}"
    )


def confirm_reserve(space: space_mod.Space) -> int:
    """Restarts the search leaves for the leaders' confirmation: one when it confirms at all."""
    return 1 if space.search.confirm else 0


def trials_for(x: space_mod.Expanded, hosts: int) -> int:
    """How many points a campaign measures: its budget less the one baseline, the restart the
    leaders' confirmation keeps and the one SGLang's adaptive mode takes, at most every valid
    point. The hosts share one baseline, so their number does not change it."""
    adaptive = 0 if adaptive_why_not(x) else 1
    return min(len(x.valid), max(0, x.space.budget.restarts - 1 - confirm_reserve(x.space) - adaptive))


def estimate(x: space_mod.Expanded, hosts: int) -> Estimate:
    """Restarts and wall time of a campaign on `hosts` hosts: the baseline, then trials up to the
    budget (or the valid points), `hosts` at a time, each host taking the next as it finishes;
    restart time from the ledger's
    restarting deploys, bench time from its runs at the same levels."""
    hosts = max(1, hosts)
    trials = trials_for(x, hosts)
    adaptive = 0 if adaptive_why_not(x) else 1
    restarts = min(x.space.budget.restarts, 1 + len(x.valid) + confirm_reserve(x.space) + adaptive)
    deploys = [
        float(r["duration_s"])
        for r in ledger.history(limit=200)
        if r["restarted"] and r["result"] == "healthy" and r["action"] == "deploy" and r["duration_s"] > 0
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
        same = [
            float(r["duration_s"])
            for r in rows
            if sweep_mod.level_of(r) == level and r["duration_s"] and r["duration_s"] > 0
        ]
        if same:
            run_s = statistics.median(same)
        else:
            guessed += 1
            streams = max(1, s.concurrency or 1)
            run_s = s.requests * s.max_tokens / (GUESS_TOK_S * streams)
            if s.request_rate:  # open loop: the requests arrive over requests / rate seconds at least
                run_s = max(run_s, s.requests / s.request_rate)
        bench_s += run_s * x.traffic.repeat
    basis.append(
        f"bench {bench_s:.0f} s a trial: "
        + (
            f"{guessed} of {len(x.traffic.levels())} levels guessed at {GUESS_TOK_S:g} tok/s a stream"
            if guessed
            else "the ledger's runs at these levels"
        )
    )
    rounds = -(-(trials + 1) // hosts)  # the baseline is one more job of one host
    return Estimate(
        restarts, trials, rounds, restart_s, bench_s, rounds * (restart_s + bench_s), "; ".join(basis)
    )
