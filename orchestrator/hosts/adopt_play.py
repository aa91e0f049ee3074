"""adopt's plays: find the SGLang servers started by hand on each host, and start one again as it
was when the unit that took it over failed (playbooks/adopt.yml).

Engine layer: never prints. What a found server maps to is render/adopt.py's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import ledger
from orchestrator.hosts import module_results, readback
from orchestrator.hosts.playvars import AdoptRequest, PlayVars, Relaunch
from orchestrator.hosts.runner import PlayResult, run_playbook
from orchestrator.render import reverse

#: The fields of a profile that may differ between hosts running "the same" server: none of the
#: server's, only the words about where it came from.
PER_HOST = ("description",)


@dataclass
class Found:
    """What one host runs that the tool did not start."""

    host: str
    servers: list[module_results.AdoptServer] = field(default_factory=list)
    sglang_version: str = ""
    problems: list[str] = field(default_factory=list)
    #: Why the host was not read (unreachable, the module failed); "" when it was.
    error: str = ""
    #: The service manager's $PATH there, which a unit gets ("" unknown).
    systemd_path: str = ""
    #: The orchestrator units deployed there.
    units: list[str] = field(default_factory=list)


def _first_line(msg: Any, run: Any) -> str:
    text = str(msg).strip()
    if text:
        return text.splitlines()[0]
    return (
        "unreachable"
        if run.failed is not None and run.failed.kind == "unreachable"
        else "the play did not reach it"
    )


def find(inventory: Path, *, limit: str | None = None, port: int = 0, pid: int = 0) -> dict[str, Found]:
    """Every selected host's hand-started SGLang servers (by `port`, by `pid`, else all)."""
    orch = PlayVars(adopt=AdoptRequest(action="find", port=port, pid=pid))
    play = run_playbook("adopt.yml", inventory, orch, limit=limit)
    return {host: _found(host, play) for host in sorted(play.hosts)}


def _found(host: str, play: PlayResult) -> Found:
    run = play.hosts[host]
    result = readback.last_results(run).get(module_results.ADOPT)
    if isinstance(result, module_results.AdoptResult) and run.failed is None:
        found = Found(
            host, list(result.servers or []), result.sglang_version or "", list(result.problems or [])
        )
        found.systemd_path = result.systemd_path or ""
        found.units = list(getattr(result, "units", None) or [])
        return found
    return Found(host, error=_first_line(run.failed.result.get("msg", "") if run.failed else "", run))


def choose(
    found: dict[str, Found], *, port: int | None, pid: int | None, unit_name: str = "sglang.service"
) -> tuple[dict[str, module_results.AdoptServer], list[str]]:
    """The one server of each host to adopt, and every line that stops the adoption: a host not
    read, a host's own problems, a host running several servers when nothing picks one, a server
    in a container (its profile would run it outside), a unit name the host already deploys."""
    chosen: dict[str, module_results.AdoptServer] = {}
    problems: list[str] = []
    for host, f in found.items():
        if f.error:
            problems.append(f"{host}: not read: {f.error}")
            continue
        problems += [f"{host}: {p}" for p in f.problems]
        mine = [s for s in f.servers if not s.ours]
        if not mine:
            continue
        if len(mine) > 1:
            listed = ", ".join(f"PID {s.pid} on port {','.join(map(str, s.ports)) or '?'}" for s in mine)
            problems.append(
                f"{host} runs {len(mine)} SGLang servers ({listed}): pick one with --port or --pid"
            )
            continue
        seen = mine[0]
        if seen.container:
            engine, cid = seen.container.get("engine", "?"), seen.container.get("id", "")[:12]
            problems.append(
                f"{host}: PID {seen.pid} runs in {engine} container {cid}: adopt writes host profiles; "
                "write one with runtime.kind: docker or podman by hand (docs/containers.md)"
            )
            continue
        if unit_name in f.units:
            problems.append(
                f"{host}: {unit_name} is already an orchestrator unit there: give the take-over another "
                "unit with --unit-name"
            )
            continue
        chosen[host] = seen
    if pid is not None and len(chosen) > 1:
        problems.append(f"--pid {pid} names a process of one host: add --limit HOST")
    return chosen, problems


def live(host: str, seen: module_results.AdoptServer, systemd_path: str = "") -> reverse.Live:
    """What the host read of one server, as the mapping takes it."""
    return reverse.Live(
        argv=list(seen.argv),
        env=dict(seen.env),
        secrets=dict(seen.secrets),
        python=seen.python,
        cwd=seen.cwd,
        user=seen.user,
        entry=seen.entry,
        host=host,
        pid=seen.pid,
        passwd_home=seen.home or None,
        passwd_shell=seen.shell or None,
        systemd_path=systemd_path or None,
    )


def one_profile(
    adoptions: dict[str, reverse.Adoption], secrets: dict[str, dict[str, str]] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """One profile for every host (the first host's), and a line for each host whose server
    differs from it, naming the field; or a secret (`secrets`: host -> name -> sha256)."""
    if not adoptions:
        return {}, []
    hosts = list(adoptions)
    data = dict(adoptions[hosts[0]].data)
    if len(hosts) > 1:
        data["description"] = f"Adopted from {len(hosts)} hosts ({', '.join(hosts)}), started by hand"
    problems = _secrets_differ(hosts, secrets or {})
    first = _flat(adoptions[hosts[0]].data)
    for host in hosts[1:]:
        other = _flat(adoptions[host].data)
        for key in sorted(set(first) | set(other)):
            if key.split(".")[0] in PER_HOST or first.get(key) == other.get(key):
                continue
            problems.append(
                f"{host} differs from {hosts[0]}: {key} is {_said(other.get(key))} there and "
                f"{_said(first.get(key))} on {hosts[0]}: adopt them one at a time (--limit), as two profiles"
            )
    return data, problems


def _secrets_differ(hosts: list[str], secrets: dict[str, dict[str, str]]) -> list[str]:
    """A line for each secret whose value differs between hosts (their sha256, as the hosts
    read them): one profile would give every host the first host's."""
    first = secrets.get(hosts[0], {})
    out = []
    for host in hosts[1:]:
        other = secrets.get(host, {})
        for name in sorted(set(first) | set(other)):
            if first.get(name) != other.get(name):
                out.append(
                    f"{host}'s {name} is not {hosts[0]}'s: one profile would give both the same; "
                    "adopt them one at a time (--limit), as two profiles"
                )
    return out


def command_digest(plan: Any) -> str:
    """What a server runs, as a short digest: the argv and environment a Plan renders. A take-over
    happens only while the profile renders what adopt proved equal to the live command."""
    import hashlib

    return hashlib.sha256(json.dumps([plan.argv, plan.environment]).encode()).hexdigest()[:16]


def secret_mismatches(prof: Any, live: dict[str, str]) -> list[str]:
    """For each secret of the profile whose file exists: a line when its value is not the one the
    server runs with (`live`: name -> sha256, as the host read it), so a take-over never swaps a
    key unseen."""
    import hashlib

    from orchestrator.errors import InputError
    from orchestrator.hosts import secrets

    refs = {"--api-key": prof.api_key} if prof.api_key is not None else {}
    refs.update(prof.secret_env)
    out = []
    for name, ref in refs.items():
        held = live.get(name)
        if held is None or (ref.file and not Path(ref.file).expanduser().is_file()):
            continue
        try:
            value = secrets._resolve(ref, "api_key" if name == "--api-key" else f"secret_env.{name}")
        except InputError as exc:
            out.append(str(exc))
            continue
        if hashlib.sha256(value.encode()).hexdigest() != held:
            where = ref.file or f"${ref.env}"
            out.append(f"{where} does not hold the {name} the server runs with: put that value there")
    return out


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flat(value, name + "."))
        else:
            out[name] = value
    return out


def _said(value: Any) -> str:
    return "unset" if value is None else repr(value)


def dump(data: dict[str, Any]) -> str:
    """The profile as YAML, in its fields' order."""
    import yaml

    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)


def record(chosen: dict[str, module_results.AdoptServer], prof: Any) -> None:
    """Each adopted server in the ledger: the next deploy of `prof` on its host stops it first,
    while `prof` renders what was proved (command_digest) and its secrets hold the server's."""
    from orchestrator.render import launch

    digest = command_digest(launch.build(prof))
    profile, unit_name, port = prof.name, prof.service.unit_name, prof.server.port
    for host, s in chosen.items():
        command: dict[str, Any] = {"argv": s.argv, "cwd": s.cwd, "user": s.user, "log": s.log}
        command |= {"digest": digest, "secrets": dict(s.secrets)}
        ledger.record_adoption(
            {
                "host": host,
                "unit_name": unit_name,
                "profile": profile,
                "pid": s.pid,
                "start_ticks": s.start_ticks,
                "port": port,
                "command": _json(command),
                "state": "pending",
            }
        )


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def relaunch(
    inventory: Path,
    hosts: dict[str, Relaunch],
    on_event: Any = None,
) -> dict[str, dict[str, Any]]:
    """Start the hand command again where the unit that took it over failed: each host's unit is
    stopped and disabled, then the command the take-over saved on the host runs as it ran.
    Returns host -> what the relaunch reported ({pid, healthy, log, ...}, or {error})."""
    orch = PlayVars(adopt=AdoptRequest(action="relaunch", relaunch=hosts))
    play = run_playbook("adopt.yml", inventory, orch, limit=",".join(hosts), on_event=on_event)
    out: dict[str, dict[str, Any]] = {}
    for host in hosts:
        run = play.hosts.get(host)
        if run is None:
            out[host] = {"error": "host not reached"}
            continue
        result = readback.last_results(run).get(module_results.ADOPT)
        said = result.model_dump(exclude_none=True) if result is not None else {}
        if run.failed is not None:
            said["error"] = _first_line(run.failed.result.get("msg", ""), run)
        out[host] = said or {"error": "the relaunch did not run"}
    return out
