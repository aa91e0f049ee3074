"""The lab's gateway: SGLang's own `smg` on the control machine's loopback, the lab hosts its workers.

A fleet behind a gateway is drained there before a worker stops. This puts the real gateway in front
of the lab, so a deploy can be tried under traffic.

`smg` is PyPI's smg 1.x (the `gateway` extra), or another one given with --smg. It runs in its own
session, so it outlives the command that started it. It routes round robin to
http://<host address>:<worker port> for every lab host. Its Prometheus exporter would bind 29000 on
all interfaces unless told otherwise. Here it goes to 127.0.0.1:<port + 1>.

Layout under `lab_dir()`:

    gateway.json            the record: pid and its start time, url, port, workers, log, smg
    gateway.log             smg's output (--log-level warn)
    inventory-gateway.yml   inventory.yml plus all.vars.orchestrator_gateway_url, for deploys through it

Engine layer: never prints. `up`, `down` and `state` return typed results or raise.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from orchestrator.errors import InputError, OrchestratorError
from orchestrator.lab import nspawn
from orchestrator.paths import module_utils

#: The same client as the roles' (plugins/module_utils/orchestrator_gateway.py).
smg_api = module_utils("orchestrator_gateway")

DEFAULT_PORT = 39000
#: The port the lab's servers listen on (a profile's default).
WORKER_PORT = 30000
#: Every worker registered and healthy within this, or `up` gives up: smg itself registers a worker
#: within a few seconds of its /health answering 200.
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 5.0
#: The gateway the `gateway` extra installs: smg 1.x (Shepherd Model Gateway). The worker API
#: (/workers with each worker's status, /readiness) was read from 1.13; sglang-router 0.3.2, the
#: release before smg left that package, is tested too (SMG_PREVIOUS).
SMG_REQUIREMENT = "smg>=1.13,<2"
SMG_PREVIOUS = "sglang-router==0.3.2"
INVENTORY_VAR = "orchestrator_gateway_url"


@dataclass(frozen=True)
class PdSplit:
    """A prefill/decode lab fleet: which lab hosts serve each role, and the prefill bootstrap port."""

    prefill: tuple[str, ...]
    decode: tuple[str, ...]
    bootstrap_port: int = 8998


@dataclass(frozen=True)
class GatewayState:
    """A running gateway, as `up` left it or `state` found it."""

    url: str
    """http://127.0.0.1:<port>: where clients send requests, and deploys drain workers."""
    pid: int
    workers: tuple[str, ...]
    """The worker URLs smg was started with, one per lab host."""
    inventory: Path
    """The lab inventory with `orchestrator_gateway_url` set."""
    log: Path
    reused: bool = False
    """True when `up` found this gateway already running with the same workers and port."""


@dataclass(frozen=True)
class GatewayWorker:
    """One worker as smg's GET /workers lists it; `healthy` is None while smg has not registered it."""

    url: str
    healthy: bool | None


def _record_path() -> Path:
    return nspawn.lab_dir() / "gateway.json"


def inventory_path() -> Path:
    return nspawn.lab_dir() / "inventory-gateway.yml"


def _log_path() -> Path:
    return nspawn.lab_dir() / "gateway.log"


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One gateway up/down at a time: two would both find no gateway and start two."""
    nspawn.lab_dir().mkdir(parents=True, exist_ok=True)
    with open(nspawn.lab_dir() / ".gateway.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as err:
            raise OrchestratorError(f"another lab gateway up/down is running (lock {lock.name})") from err
        yield


def _load() -> dict | None:
    try:
        return json.loads(_record_path().read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise OrchestratorError(
            f"cannot read the gateway record {_record_path()}: {err}; remove it (and stop its smg by hand)"
        ) from err


def _save(record: dict) -> None:
    tmp = _record_path().with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, _record_path())


def _as_state(record: dict, reused: bool = False) -> GatewayState:
    return GatewayState(
        url=record["url"],
        pid=record["pid"],
        workers=tuple(record["workers"]),
        inventory=inventory_path(),
        log=Path(record["log"]),
        reused=reused,
    )


def state() -> GatewayState | None:
    """The recorded gateway if its smg is still running, else None."""
    record = _load()
    if record is None or not nspawn._alive(record.get("pid"), record.get("pid_start")):
        return None
    return _as_state(record)


def _lab_inventory() -> dict:
    path = nspawn.lab_dir() / "inventory.yml"
    try:
        inventory = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise InputError("no lab is up: run `orchestrator lab up` first") from None
    hosts = (((inventory or {}).get("all") or {}).get("children") or {}).get("lab", {}).get("hosts")
    if not hosts:
        raise OrchestratorError(f"{path} lists no lab hosts; run `orchestrator lab up` again")
    return inventory


def _worker_urls(inventory: dict, worker_port: int, names: tuple[str, ...] | None = None) -> tuple[str, ...]:
    hosts = inventory["all"]["children"]["lab"]["hosts"]
    return tuple(
        f"http://{host['ansible_host']}:{worker_port}"
        for name, host in hosts.items()
        if names is None or name in names
    )


def _check_split(inventory: dict, pd: PdSplit) -> None:
    hosts = inventory["all"]["children"]["lab"]["hosts"]
    unknown = [h for h in (*pd.prefill, *pd.decode) if h not in hosts]
    if unknown:
        raise InputError(f"{', '.join(unknown)}: not a lab host (the lab has {', '.join(hosts)})")
    both = set(pd.prefill) & set(pd.decode)
    if both:
        raise InputError(f"{', '.join(sorted(both))}: a server has one role; give it --prefill or --decode")
    if not pd.prefill or not pd.decode:
        raise InputError("a prefill/decode fleet needs one prefill host and one decode host at least")


def with_roles(inventory: dict, pd: PdSplit) -> dict:
    """The lab inventory with the groups `prefill` and `decode` of a PD fleet (docs/pd.md)."""
    children = inventory.setdefault("all", {}).setdefault("children", {})
    children["prefill"] = {"hosts": {h: None for h in pd.prefill}}
    children["decode"] = {"hosts": {h: None for h in pd.decode}}
    return inventory


def _write_inventory(inventory: dict, url: str, pd: PdSplit | None = None) -> Path:
    if pd is not None:
        inventory = with_roles(inventory, pd)
    inventory.setdefault("all", {}).setdefault("vars", {})[INVENTORY_VAR] = url
    header = (
        "# Written by `orchestrator lab gateway up`: the lab's inventory.yml with the gateway's URL;\n"
        "# rewritten on every gateway up, removed by `lab gateway down` and `lab down`.\n"
    )
    path = inventory_path()
    path.write_text(header + yaml.safe_dump(inventory, sort_keys=False, width=1000))
    return path


def _smg(given: str | None = None) -> str:
    """The smg to run: `given` (a path, or a name on PATH), else `smg` on PATH."""
    smg = shutil.which(given or "smg")
    if smg is None and given:
        raise InputError(f"--smg {given}: no such program (give the path of an smg executable)")
    if smg is None:
        raise InputError(
            "the lab gateway runs SGLang's `smg`, which is not installed: "
            f"pip install 'orchestrator[gateway]' (or pip install '{SMG_REQUIREMENT}')"
        )
    return smg


def _takes(smg: str, flag: str) -> bool:
    """Whether this smg's `launch` has `flag` (sglang-router 0.3.2's has fewer than 1.x's)."""
    try:
        done = subprocess.run([smg, "launch", "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return flag in done.stdout


def _check_free(port: int, what: str) -> None:
    """Nothing listens on the port. SO_REUSEADDR as smg (and any server) binds: connections of a
    gateway just stopped, left in TIME-WAIT, do not keep the next one from starting."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as err:
            raise InputError(
                f"port {port} on 127.0.0.1 ({what}) is taken: {err.strerror or err}; "
                "stop what holds it, or give the gateway another --port"
            ) from None


def up(
    port: int = DEFAULT_PORT,
    worker_port: int = WORKER_PORT,
    timeout_s: float = READY_TIMEOUT_S,
    smg: str | None = None,
    pd: PdSplit | None = None,
    health_interval_s: int | None = None,
) -> GatewayState:
    """Start smg (`smg`: a path or a name on PATH; default `smg` on PATH) in front of the lab hosts
    (a no-op when the same smg already runs with the same workers and port), write
    inventory-gateway.yml, and wait until every worker is registered and healthy.

    `pd`: smg in PD mode (--pd-disaggregation) with those hosts as prefill and decode workers, and
    the groups prefill and decode in inventory-gateway.yml. It waits for the router only: the fleet
    is deployed through it (smg registers each server once it answers, checking every second).
    `health_interval_s`: smg's health checks that often, a worker Failed after 2 misses (default:
    smg's own, every 60 s).

    A gateway recorded with other workers or another port is stopped first. When the workers do not
    all serve within `timeout_s`, the smg this call started is stopped again and the error names them.
    """
    if not 1 <= port < 65535:
        raise InputError(f"--port must be between 1 and 65534 (port + 1 serves metrics), not {port}")
    program = _smg(smg)
    inventory = _lab_inventory()
    if pd is not None:
        _check_split(inventory, pd)
        workers = _worker_urls(inventory, worker_port, pd.prefill) + _worker_urls(
            inventory, worker_port, pd.decode
        )
    else:
        workers = _worker_urls(inventory, worker_port)
    split = None if pd is None else [list(pd.prefill), list(pd.decode), pd.bootstrap_port]
    with _locked():
        record = _load()
        running = record is not None and nspawn._alive(record.get("pid"), record.get("pid_start"))
        same = (list(workers), port, program, split, health_interval_s)
        if running and record and _same(record) == same:
            _write_inventory(inventory, record["url"], pd)
            _wait_serving(record, timeout_s)
            return _as_state(record, reused=True)
        if record is not None:
            _stop(record)
        record = _start(program, port, workers, pd, health_interval_s)
        try:
            _wait_serving(record, timeout_s)
        except BaseException:  # Ctrl-C as well: an smg nobody waited for is not left behind
            _stop(record)
            raise
        _write_inventory(inventory, record["url"], pd)
        return _as_state(record)


def _same(record: dict) -> tuple:
    return (record["workers"], record["port"], record.get("smg"), record.get("pd"), record.get("health_s"))


def _start(
    smg: str, port: int, workers: tuple[str, ...], pd: PdSplit | None = None, health_s: int | None = None
) -> dict:
    """Start smg in its own session, recorded the moment it exists so `down` finds it after a crash."""
    _check_free(port, "the gateway")
    _check_free(port + 1, "the gateway's Prometheus metrics")
    argv = [smg, "launch", "--host", "127.0.0.1", "--port", str(port)]
    if pd is None:
        argv += ["--worker-urls", *workers]
    else:
        prefill = workers[: len(pd.prefill)]
        argv += ["--pd-disaggregation"]
        for url in prefill:
            argv += ["--prefill", url, str(pd.bootstrap_port)]
        for url in workers[len(pd.prefill) :]:
            argv += ["--decode", url]
        # A server not up yet is registered within a second of answering (smg's default: 30 s).
        argv += ["--worker-startup-check-interval", "1"]
    if health_s is not None:
        argv += ["--health-check-interval-secs", str(health_s), "--health-failure-threshold", "2"]
    if _takes(smg, "--shutdown-grace-period-secs"):  # smg 1.x: `down` waits 1 s for requests, not 5
        argv += ["--shutdown-grace-period-secs", "1"]
    argv += ["--policy", "round_robin", "--log-level", "warn"]
    argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(port + 1)]
    log = _log_path()
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    record = {
        "pid": proc.pid,
        "pid_start": nspawn._proc_start(proc.pid),
        "url": f"http://127.0.0.1:{port}",
        "port": port,
        "workers": list(workers),
        "log": str(log),
        "smg": smg,
        "pd": None if pd is None else [list(pd.prefill), list(pd.decode), pd.bootstrap_port],
        "health_s": health_s,
    }
    _save(record)
    return record


def _wait_serving(record: dict, timeout_s: float) -> None:
    """Until GET /readiness says ready and GET /workers lists every worker healthy (a PD gateway:
    until the router answers /health)."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=record["url"], timeout=5) as client:
        while True:
            if not nspawn._alive(record["pid"], record["pid_start"]):
                raise OrchestratorError(
                    f"smg (pid {record['pid']}) exited; end of {record['log']}:\n"
                    f"{nspawn._tail(record['log'])}"
                )
            if record.get("pd") and _answers(client):
                return
            waiting = [w.url for w in _listed(client, record["workers"]) if not w.healthy]
            if not waiting and _ready(client):
                return
            if time.monotonic() >= deadline:
                raise OrchestratorError(
                    f"the gateway's workers {', '.join(waiting) or '(all)'} are not serving after "
                    f"{timeout_s:.0f} s: deploy first: python -m orchestrator deploy -i "
                    f"{nspawn.lab_dir() / 'inventory.yml'} --profile NAME (smg's log: {record['log']})"
                )
            time.sleep(0.3)


def _answers(client: httpx.Client) -> bool:
    try:
        return client.get("/health").status_code == 200
    except httpx.HTTPError:
        return False


def _ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readiness").json().get("status") == "ready"
    except (httpx.HTTPError, ValueError, AttributeError):
        return False


def _listed(client: httpx.Client, workers: list[str]) -> tuple[GatewayWorker, ...]:
    """Each of `workers` as smg lists it; all unregistered while smg does not answer yet."""
    try:
        listed = client.get("/workers").json()["workers"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        listed = []
    healthy = {w.get("url"): smg_api.healthy(w) for w in listed}
    return tuple(GatewayWorker(url, healthy.get(url)) for url in workers)


def worker_health(gateway: GatewayState) -> tuple[GatewayWorker, ...]:
    """What smg says of each worker now (GET /workers)."""
    with httpx.Client(base_url=gateway.url, timeout=5) as client:
        try:
            client.get("/health").raise_for_status()
        except httpx.HTTPError as err:
            raise OrchestratorError(f"the gateway at {gateway.url} does not answer: {err}") from err
        return _listed(client, list(gateway.workers))


def down() -> bool:
    """Stop the recorded smg and remove gateway.json and inventory-gateway.yml; True if one was running."""
    with _locked():
        record = _load()
        was_running = record is not None and _stop(record)
        inventory_path().unlink(missing_ok=True)
        return was_running


def _stop(record: dict) -> bool:
    """SIGTERM, then SIGKILL after STOP_TIMEOUT_S; the record goes once the process has. True if it ran."""
    pid, start = record.get("pid"), record.get("pid_start")
    if running := nspawn._alive(pid, start):
        os.kill(pid, signal.SIGTERM)
        if not nspawn._wait_gone(pid, start, STOP_TIMEOUT_S):
            os.kill(pid, signal.SIGKILL)
            if not nspawn._wait_gone(pid, start, STOP_TIMEOUT_S):
                raise OrchestratorError(f"smg (pid {pid}) survives SIGKILL; gateway record kept")
    _record_path().unlink(missing_ok=True)
    return running


# `lab down` stops the gateway before the hosts it routes to go.
nspawn.ON_DOWN.append(down)
