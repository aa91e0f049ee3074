"""Scripted plays: deploy(), its rollbacks, canary and the gateway's restore, run against what real
lab runs returned, with no host.

A recording (tests/data/plays/NAME.json, made by scripts/record_play.py from a lab run's artifacts)
holds each host's events as runner.run_playbook hands them to the engine: kind, role, action (the
module) and module result, with the plan the run was made for and the lab test that made it.

`Script` stands in for run_playbook in every engine module that imported it. Each play the code
starts is answered by the script's next recording, once it is checked to be the play that recording
was made for: the same playbook, the same hosts, and each host's unit digest. What was asked
(`Ask`: playbook, hosts, every host's plan) is kept for the test, with the report.

A test may change a recording, and says so where it does: `renamed` (another host's name),
`edited` (one result's fields), `for_any_plan` (a host whose events answer another plan: the test
says why that changes nothing), `with_unreached` (hosts of a larger play the recording never
reached), `together` (hosts of several recordings in one play).
"""

from __future__ import annotations

import copy
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

from orchestrator.errors import OrchestratorError
from orchestrator.hosts import deploy as deploy_mod
from orchestrator.hosts import rotation, runner
from orchestrator.hosts.playvars import HostPlan, PlayVars
from orchestrator.hosts.runner import HostRun, PlayCanceled, PlayResult, TaskEvent
from orchestrator.profile import model as profile_mod
from orchestrator.profile.model import Profile

PLAYS = Path(__file__).resolve().parents[1] / "data" / "plays"
#: The lab's hosts as its inventory names them (orchestrator/lab/nspawn.py): a multi-node rank's unit
#: names rank 0's address, so the recorded digests hold only with these addresses.
LAB = {"lab1": "10.213.0.11", "lab2": "10.213.0.12", "lab3": "10.213.0.13", "lab4": "10.213.0.14"}
#: The lab gateway's URL as its deploys had it (orchestrator/lab/gateway.py).
LAB_GATEWAY = "http://127.0.0.1:39000"


def variant(tmp_path: Path, name: str, extends: str = "cg_5tok", **sections: Any) -> Profile:
    """A profile extending `extends` with `sections` changed, named as the lab test's was
    (tests/lab/labutil.py `variant`): the name is in the unit, so in its digest."""
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump({"extends": extends, **sections}))
    return profile_mod.load(str(path))


def lab_inventory(tmp_path: Path, *, gateway: bool = False, **more: str) -> Path:
    """The lab's inventory (group `lab`), `more` hosts (name=address) added; with `gateway`, the
    lab gateway's URL for every host, as inventory-gateway.yml has it."""
    hosts = {name: {"ansible_host": address} for name, address in {**LAB, **more}.items()}
    data: dict[str, Any] = {"all": {"children": {"lab": {"hosts": hosts}}}}
    if gateway:
        data["all"]["vars"] = {"orchestrator_gateway_url": LAB_GATEWAY}
    path = tmp_path / ("inventory-gateway.yml" if gateway else "inventory.yml")
    path.write_text(yaml.safe_dump(data))
    return path


@dataclass(frozen=True)
class HostRecord:
    """One host's part of a recorded play."""

    events: tuple[dict[str, Any], ...]
    elapsed_s: float
    #: The plan the run had for this host ({profile, digest, ...}; {} in a play of no plans: status).
    plan: dict[str, Any]
    #: Answers a plan other than the one it was recorded for (the test says why that is fine).
    loose: bool = False


@dataclass(frozen=True)
class Recording:
    """One play as the lab ran it, possibly changed by a test (`edits` says how)."""

    name: str
    playbook: str
    status: str
    rc: int
    hosts: dict[str, HostRecord] = field(repr=False)
    #: Hosts the play was asked for and never reached (an earlier batch failed; Ctrl-C).
    unreached: tuple[str, ...] = ()
    lab_test: str = ""
    edits: tuple[str, ...] = ()

    @classmethod
    def load(cls, name: str) -> Recording:
        data = json.loads((PLAYS / f"{name}.json").read_text())
        plans = data["plan"]["hosts"]
        hosts = {
            host: HostRecord(tuple(h["events"]), h["elapsed_s"], plans.get(host, {}))
            for host, h in data["hosts"].items()
        }
        rec = data["recorded"]
        return cls(
            name, rec["playbook"], rec["status"], rec["rc"], hosts, tuple(data["unreached"]), rec["lab_test"]
        )

    def _changed(self, edit: str, **fields: Any) -> Recording:
        return replace(self, edits=(*self.edits, edit), **fields)

    def result(self, host: str, action: str) -> dict[str, Any]:
        """The result of the last finished task of `action` on `host` (as HostRun.result_of)."""
        found = self._last(host, action)
        return copy.deepcopy(self.hosts[host].events[found].get("result", {}))

    def _last(self, host: str, action: str) -> int:
        events = self.hosts[host].events
        for i in range(len(events) - 1, -1, -1):
            if events[i]["action"] == action and events[i]["kind"] not in ("start", "skipped"):
                return i
        raise KeyError(f"{self.name}: {host} ran no {action}")

    def renamed(self, **names: str) -> Recording:
        """Hosts under other names: renamed(lab2="lab1") is lab1's events answering for lab2."""
        old = {v: k for k, v in names.items()}
        hosts = {old.get(h, h): r for h, r in self.hosts.items()}
        unreached = tuple(old.get(h, h) for h in self.unreached)
        edit = ", ".join(f"{v} as {k}" for k, v in names.items())
        return self._changed(edit, hosts=hosts, unreached=unreached)

    def only(self, *hosts: str) -> Recording:
        return self._changed(
            f"only {', '.join(hosts)}", hosts={h: self.hosts[h] for h in hosts}, unreached=()
        )

    def for_any_plan(self, *hosts: str) -> Recording:
        changed = {h: replace(r, loose=True) if h in hosts else r for h, r in self.hosts.items()}
        return self._changed(f"{', '.join(hosts)} answer any plan", hosts=changed)

    def with_unreached(self, *hosts: str) -> Recording:
        return self._changed(f"{', '.join(hosts)} never reached", unreached=(*self.unreached, *hosts))

    def edited(self, host: str, action: str, **fields: Any) -> Recording:
        """`host`'s last finished `action` with `fields` in its result."""
        i = self._last(host, action)
        record = self.hosts[host]
        events = [copy.deepcopy(e) for e in record.events]
        events[i] = {**events[i], "result": {**events[i].get("result", {}), **fields}}
        hosts = {**self.hosts, host: replace(record, events=tuple(events))}
        return self._changed(f"{host} {action} edited: {sorted(fields)}", hosts=hosts)

    def play_result(self) -> PlayResult:
        """The PlayResult run_playbook would have returned (or carried in PlayCanceled); its artifacts
        are the recording."""
        now = time.monotonic()
        runs = {}
        for host, record in self.hosts.items():
            events = [
                TaskEvent(host, e["kind"], e["role"], e["action"], copy.deepcopy(e.get("result", {})))
                for e in record.events
            ]
            runs[host] = HostRun(host, events, started=now - record.elapsed_s, finished=now)
        return PlayResult(self.rc, self.status, runs, PLAYS / f"{self.name}.json")


def together(*parts: Recording) -> Recording:
    """Hosts of several recordings as one play (each host's events as its own recording has them)."""
    hosts: dict[str, HostRecord] = {}
    for part in parts:
        clash = set(hosts) & set(part.hosts)
        assert not clash, f"{part.name}: {sorted(clash)} already in the play"
        hosts.update(part.hosts)
    failed = any(p.status == "failed" for p in parts)
    names = "+".join(p.name for p in parts)
    edits = tuple(f"{p.name}: {e}" for p in parts for e in p.edits)
    return Recording(
        names, parts[0].playbook, "failed" if failed else "successful", 2 if failed else 0, hosts,
        tuple(h for p in parts for h in p.unreached), edits=(*edits, "hosts of several plays in one"),
    )  # fmt: skip


@dataclass
class Ask:
    """One play the code started, as it asked for it."""

    playbook: str
    #: The hosts it named: its plans' (deploy, preflight), else --limit's ([] for every host).
    hosts: list[str]
    orch: PlayVars = field(repr=False)
    limit: str | None
    check: bool
    #: Whether a secret went to the play (its text is never kept).
    secret: bool
    answered_by: str = ""

    def plan(self, host: str) -> HostPlan:
        return self.orch.hosts[host]

    @property
    def rollback(self) -> bool:
        """A rollback's play: every host gets a unit that ran healthy there before."""
        return bool(self.orch.hosts) and all(p.trusted_digest for p in self.orch.hosts.values())


class PlayMismatch(AssertionError):
    """The code asked for a play other than the one the script answers with next."""


@dataclass
class Script:
    """run_playbook's stand-in: answers each play from the next recording, keeping what was asked."""

    answers: list[Recording] = field(default_factory=list)
    asks: list[Ask] = field(default_factory=list)
    #: Called with each ask and the recording that answered it (the gateway stand-in follows the play).
    followers: list[Callable[[Ask, Recording], None]] = field(default_factory=list, repr=False)
    mismatches: list[str] = field(default_factory=list)

    @classmethod
    def install(cls, monkeypatch: pytest.MonkeyPatch) -> Script:
        """Answer every play of the engine: each orchestrator module that imported run_playbook."""
        # Every importer of run_playbook, loaded before the patch.
        import orchestrator.hosts.deploy
        import orchestrator.hosts.logs_play
        import orchestrator.hosts.preflight_play
        import orchestrator.hosts.stop_play
        import orchestrator.tuning.canary

        script = cls()
        real = runner.run_playbook
        for name, module in list(sys.modules.items()):
            if name.startswith("orchestrator") and getattr(module, "run_playbook", None) is real:
                monkeypatch.setattr(module, "run_playbook", script)
        monkeypatch.setattr(orchestrator.hosts.deploy, "_PREFLIGHT_PASSED", {})  # no memory between tests
        return script

    def then(self, *recordings: Recording) -> Script:
        """Answer the next plays with these, in order."""
        self.answers.extend(recordings)
        return self

    def __call__(
        self,
        playbook: str,
        inventory: Path,
        orch: PlayVars,
        *,
        limit: str | None = None,
        check: bool = False,
        forks: int | None = None,
        secret: str = "",
        hide_env: Iterable[str] = (),
        on_event: Callable[[TaskEvent], None] | None = None,
        become_password: str = "",
    ) -> PlayResult:
        named = list(orch.hosts) or (limit.split(",") if limit else [])
        ask = Ask(playbook, named, orch, limit, check, bool(secret))
        self.asks.append(ask)
        if not self.answers:
            self._mismatch(
                f"{ask.playbook} on {', '.join(named) or 'every host'}: the script has no play left"
            )
        answer = self.answers.pop(0)
        ask.answered_by = answer.name + (f" ({'; '.join(answer.edits)})" if answer.edits else "")
        self._check(ask, answer)
        for follow in self.followers:
            follow(ask, answer)
        played = answer.play_result()
        for e in (e for run in played.hosts.values() for e in run.events) if on_event else ():
            on_event(e)  # the live view sees each host's events, as the play would have sent them
        if answer.status == "canceled":  # as runner._run ends a canceled play
            raise PlayCanceled(
                f"ansible-playbook canceled (rc {answer.rc}) by Ctrl-C, SIGTERM or SIGHUP", played
            )
        if answer.status not in ("successful", "failed"):
            raise OrchestratorError(f"ansible-playbook {answer.status} (rc {answer.rc}): ")
        return played

    def _mismatch(self, why: str) -> NoReturn:
        self.mismatches.append(why)
        raise PlayMismatch(f"the code asked for {why}")

    def _check(self, ask: Ask, answer: Recording) -> None:
        """The recording answers this very play: playbook, hosts and every host's unit digest."""
        where = f"{ask.playbook} on {', '.join(ask.hosts)}; the script's next play is {answer.name}"
        if answer.playbook != ask.playbook:
            self._mismatch(f"{where}, a play of {answer.playbook}")
        recorded = sorted([*answer.hosts, *answer.unreached])
        if ask.hosts and sorted(ask.hosts) != recorded:
            self._mismatch(f"{where}, recorded on {', '.join(recorded)}")
        for host, record in answer.hosts.items():
            plan = ask.orch.hosts.get(host)
            if plan is not None and not record.loose and plan.digest != record.plan.get("digest"):
                self._mismatch(
                    f"{where}: {host} is to get unit {plan.digest} ({plan.profile}); the recording ran "
                    f"{record.plan.get('digest')} ({record.plan.get('profile')})"
                )

    def left(self) -> list[str]:
        return [r.name for r in self.answers]


def scripted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Script]:
    """A test's `plays` fixture: a Script answering every play, with a private state directory
    (ledger, runs). At the end every scripted play was asked for, and every ask matched its answer."""
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    # A deploy to several hosts first compares their model files in a preflight play of its own
    # (test_same_files.py; tests/lab/test_model_files.py): these recordings start at the deploy.
    monkeypatch.setattr(deploy_mod, "same_files", lambda *args: None)
    script = Script.install(monkeypatch)
    yield script
    assert not script.mismatches, f"plays that did not match the script: {script.mismatches}"
    assert not script.left(), f"scripted plays never asked for: {script.left()}"


class Gateway:
    """SGLang's gateway (smg 0.3.2) at the HTTP call of the shipped client (orchestrator_gateway._call):
    GET /workers lists, DELETE /workers/{id} takes one out, POST /workers puts one in, healthy: the
    shapes test_gateway_smg.py pins against the real smg; and a server's GET /get_load, idle, which a
    canary's drain asks. It follows each answered play's own gateway steps (a recorded sglang_gateway
    out or back), as that play did them to the real one."""

    def __init__(self, urls: Iterable[str], *, refuse_add: bool = False) -> None:
        self.workers = {
            u: {"id": f"w{i}", "url": u, "is_healthy": True, "load": 0} for i, u in enumerate(urls)
        }
        self.refuse_add = refuse_add
        #: What orchestrator itself sent (method, path), the plays' own steps not included.
        self.calls: list[tuple[str, str]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch, script: Script) -> Gateway:
        monkeypatch.setattr(rotation.client, "_call", self.call)
        script.followers.append(self.follow)
        return self

    def listed(self) -> dict[str, bool]:
        return {u: bool(w["is_healthy"]) for u, w in self.workers.items()}

    def call(
        self, method: str, url: str, key: str = "", body: Any = None, timeout: float = 10.0
    ) -> tuple[int, Any]:
        path = "/" + url.split("/", 3)[3] if url.count("/") >= 3 else "/"
        self.calls.append((method, path))
        if method == "GET" and path == "/workers":
            return 200, {"workers": list(self.workers.values()), "total": len(self.workers)}
        if method == "DELETE" and path.startswith("/workers/"):
            gone = next((u for u, w in self.workers.items() if w["id"] == path.split("/")[-1]), None)
            self.workers.pop(gone or "", None)
            return (202, {}) if gone else (404, {"error": "not found"})
        if method == "GET" and path == "/get_load":  # a server's own (SGLang's), for a drain: idle
            return 200, [{"num_reqs": 0}]
        if method == "POST" and path == "/workers":
            if self.refuse_add:
                return 503, {"error": "worker health check failed"}
            self.workers[body["url"]] = {
                "id": f"w{len(self.calls)}",
                "url": body["url"],
                "is_healthy": True,
                "load": 0,
            }
            return 202, {}
        return 404, {"error": f"no {method} {path}"}

    def follow(self, ask: Ask, answer: Recording) -> None:
        for host, record in answer.hosts.items():
            plan = ask.orch.hosts.get(host)
            steps = [e for e in record.events if e["action"] == "sglang_gateway" and e["kind"] == "changed"]
            for e in steps if plan and plan.gateway else []:
                url = plan.gateway.worker_url
                if e["result"].get("state") == "absent":
                    self.workers.pop(url, None)
                else:
                    self.workers[url] = {"id": f"{host}-back", "url": url, "is_healthy": True, "load": 0}
