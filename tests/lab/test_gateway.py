"""Rollouts behind SGLang's real gateway (`smg`): each batch leaves its rotation, drains, restarts,
proves it generates and goes back, so clients sending through the gateway see no failure."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import yaml

from labutil import GOOD, deploy_json, orchestrator, service, variant
from orchestrator.lab import gateway as lab_gateway

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(shutil.which("smg") is None, reason="needs smg: pip install 'orchestrator[gateway]'"),
]


@pytest.fixture(scope="module")
def gw(lab):
    """Every lab host on GOOD, and the lab's gateway in front of them."""
    names = ",".join(h.name for h in lab.hosts)
    rc, report = deploy_json(lab, "--profile", GOOD, "--limit", names)
    assert rc == 0, report
    state = lab_gateway.up()
    yield state
    lab_gateway.down()


def deploy_through(gw, *args: str) -> tuple[int, dict]:
    """deploy --json with the inventory that names the lab's gateway."""
    done = orchestrator("deploy", "-i", str(gw.inventory), "--json", *args, timeout=600)
    try:
        return done.returncode, json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"rc {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}") from None


def listed(gw) -> dict[str, bool]:
    """{worker URL: is_healthy} as the gateway lists them now."""
    workers = httpx.get(f"{gw.url}/workers", timeout=10).json()["workers"]
    return {w["url"]: w["is_healthy"] for w in workers}


def worker_url(host) -> str:
    return f"http://{host.address}:30000"


def hold(url: str, tokens: int = 4000) -> threading.Thread:
    """A long request straight to a server, running in the background; it may be cut when that
    server is stopped (what a drain timeout means), which is no failure of the test."""

    def run() -> None:
        body = {"text": "long", "sampling_params": {"max_new_tokens": tokens}}
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"{url}/generate", json=body, timeout=120)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


class Load:
    """Clients sending 32-token /generate requests through the gateway, half of them streaming, until
    stopped; every answer that is not a whole 200 is counted by what went wrong."""

    def __init__(self, url: str, clients: int = 4) -> None:
        self.url, self.stop = url, threading.Event()
        self.sent, self.failed, self.lock = 0, Counter[str](), threading.Lock()
        self.threads = [threading.Thread(target=self.client, args=(i,)) for i in range(clients)]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()

    def client(self, index: int) -> None:
        with httpx.Client(timeout=60) as http:
            n = 0
            while not self.stop.is_set():
                n += 1
                body = {"text": f"client {index} request {n}", "sampling_params": {"max_new_tokens": 32}}
                stream = n % 2 == 0
                try:
                    problem = self.one(http, {**body, "stream": stream}, stream)
                except httpx.HTTPError as exc:
                    problem = type(exc).__name__
                with self.lock:
                    self.sent += 1
                    if problem:
                        self.failed[problem] += 1

    def one(self, http: httpx.Client, body: dict, stream: bool) -> str:
        if not stream:
            r = http.post(f"{self.url}/generate", json=body)
            done = r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 32
            return "" if done else f"status {r.status_code}"
        with http.stream("POST", f"{self.url}/generate", json=body) as r:
            if r.status_code != 200:
                return f"status {r.status_code}"
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        return "" if whole(lines, 32) else "truncated stream"


def whole(lines: list[str], tokens: int) -> bool:
    """A /generate stream that ended with all its tokens and `[DONE]`; not one that smg 1.x ended
    with an error event (its worker cut it) and `[DONE]`."""
    if len(lines) < 2 or lines[-1] != "data: [DONE]":
        return False
    last = json.loads(lines[-2].removeprefix("data: "))
    return last.get("meta_info", {}).get("completion_tokens") == tokens


def test_a_rolling_restart_behind_the_gateway_fails_no_request(lab, gw, rolled=None):
    """Behind `smg` on PATH: 1.x, the gateway extra's (test_gateway_previous.py: 0.3.2, on
    `rolled`, two of the four hosts)."""
    hosts = rolled or lab.hosts
    names = ",".join(h.name for h in hosts)
    before = {h.name: service(h)["MainPID"] for h in hosts}
    with Load(gw.url) as load:
        time.sleep(2)
        rc, report = deploy_through(
            gw, "--profile", GOOD, "--limit", names, "--serial", "1", "--force-restart"
        )
        time.sleep(1)
    assert rc == 0, report
    assert load.sent > 10 * len(hosts) and not load.failed, f"{load.sent} sent, failed: {dict(load.failed)}"
    for h in hosts:
        assert service(h)["MainPID"] != before[h.name]
    for r in report["hosts"]:
        g = r["gateway"]
        assert g["worker_url"] == worker_url(next(h for h in lab.hosts if h.name == r["host"]))
        assert g["out"]["changed"] and g["out"]["before"]["is_healthy"]
        assert g["drain"]["timed_out"] is False and g["drain"]["in_flight"] == 0
        assert g["prove"]["status"] == 200
        back = g["back"]["after"]
        assert back["listed"] and back["is_healthy"] and back.get("status", "ready") == "ready", g
    assert listed(gw) == {worker_url(h): True for h in lab.hosts}


def long_stream(url: str, outcome: list[str], tokens: int = 8000) -> threading.Thread:
    """A streaming /generate through the gateway far longer than a rollout, in the background;
    what its client saw lands in `outcome`: "whole", "truncated" or the error's name."""

    def run() -> None:
        body = {"text": "long", "stream": True, "sampling_params": {"max_new_tokens": tokens}}
        try:
            with httpx.stream("POST", f"{url}/generate", json=body, timeout=120) as r:
                lines = [line for line in r.iter_lines() if line.startswith("data: ")]
            outcome.append("whole" if whole(lines, tokens) else "truncated")
        except httpx.HTTPError as exc:
            outcome.append(type(exc).__name__)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_without_drain_the_same_rollout_fails_requests(lab, gw):
    """The baseline the drain is for: the gateway keeps routing to servers that are stopping, and
    the requests in flight on them are cut. Every server restarts, so every long stream is."""
    names = ",".join(h.name for h in lab.hosts)
    outcome: list[str] = []
    with Load(gw.url) as load:
        streams = [long_stream(gw.url, outcome) for _ in lab.hosts]
        time.sleep(1)
        rc, report = deploy_through(
            gw, "--profile", GOOD, "--limit", names, "--serial", "1", "--force-restart", "--no-drain"
        )
        for t in streams:
            t.join(timeout=30)
    assert rc == 0, report
    assert all(not r["gateway"] for r in report["hosts"])
    assert len(outcome) == len(streams) and "whole" not in outcome, outcome
    assert load.sent > 40, load.sent


def test_check_mode_names_the_workers_it_would_drain(lab, gw):
    h = lab.hosts[0]
    done = orchestrator(
        "deploy", "-i", str(gw.inventory), "--profile", GOOD, "--limit", h.name, "--force-restart", "--check"
    )
    assert done.returncode == 0, done.stderr
    assert "gateway: would take it out of the gateway's rotation and drain it" in done.stdout
    assert listed(gw)[worker_url(h)] is True


def inventory_with(gw, tmp_path: Path, **variables: str) -> str:
    data = yaml.safe_load(Path(gw.inventory).read_text())
    data["all"]["vars"].update(variables)
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({"orchestrator_gateway_worker_url": "http://10.213.0.250:30000"}, "is not a worker of the gateway"),
        ({"orchestrator_gateway_url": "http://127.0.0.1:9"}, "does not answer"),
    ],
    ids=["not-a-worker", "gateway-down"],
)
def test_a_host_the_gateway_does_not_route_to_is_refused_before_anything_stops(
    lab, gw, tmp_path, variables, expected
):
    h = lab.hosts[1]
    pid = service(h)["MainPID"]
    inventory = inventory_with(gw, tmp_path, **variables)
    done = orchestrator("deploy", "-i", inventory, "--profile", GOOD, "--limit", h.name, "--force-restart")
    assert done.returncode == 2, done.stdout
    assert "nothing was stopped" in done.stderr and expected in done.stderr, done.stderr
    assert service(h)["MainPID"] == pid
    assert listed(gw)[worker_url(h)] is True


def test_a_failed_profile_rolls_back_and_goes_back_into_rotation_healthy(lab, gw, tmp_path):
    h = lab.hosts[2]
    broken = variant(tmp_path, "oom", server={"mem_fraction_static": 0.97})
    done = orchestrator(
        "deploy", "-i", str(gw.inventory), "--json", "--profile", broken, "--limit", h.name, "--no-preflight"
    )
    assert done.returncode == 1, done.stderr
    (r,) = json.loads(done.stdout)["hosts"]
    assert r["rolled_back_to"].startswith(GOOD), r
    assert r["gateway"]["out"]["changed"] and "prove" not in r["gateway"]  # never proven, never put back
    assert r["gateway"]["back"]["after"]["is_healthy"], r["gateway"]  # the rollback's server, healthy
    assert listed(gw)[worker_url(h)] is True


def test_ctrl_c_while_draining_puts_the_worker_back_in_rotation(lab, gw):
    h = lab.hosts[3]
    pid = service(h)["MainPID"]
    hold(worker_url(h))  # straight to the server: the drain waits for it (the gateway no longer routes here)
    argv = [sys.executable, "-m", "orchestrator", "deploy", "-i", str(gw.inventory), "--json"]
    proc = subprocess.Popen(
        [*argv, "--profile", GOOD, "--limit", h.name, "--force-restart", "--drain-timeout", "120"],
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while worker_url(h) in listed(gw):
        assert time.monotonic() < deadline, "the deploy never took the worker out"
        time.sleep(0.2)
    time.sleep(1)  # draining: the long request still runs
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    (r,) = json.loads(out)["hosts"]
    assert r["gateway"]["out"]["changed"] and r["gateway"]["back"]["after"]["is_healthy"], r["gateway"]
    assert "left_out" not in r["gateway"]
    assert service(h)["MainPID"] == pid  # interrupted before the stop: the same server, back in rotation
    assert listed(gw)[worker_url(h)] is True


def test_a_drain_timeout_reports_the_requests_still_in_flight(lab, gw):
    h = lab.hosts[0]
    hold(worker_url(h))
    time.sleep(1)
    done = orchestrator(
        "deploy", "-i", str(gw.inventory), "--json", "--profile", GOOD, "--limit", h.name,
        "--force-restart", "--drain-timeout", "2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (r,) = json.loads(done.stdout)["hosts"]
    assert r["gateway"]["drain"]["timed_out"] is True and r["gateway"]["drain"]["in_flight"] >= 1, r[
        "gateway"
    ]
    assert 2 <= r["gateway"]["drain"]["waited_s"] < 10
    assert listed(gw)[worker_url(h)] is True


def test_a_canary_is_benched_out_of_rotation_and_put_back(lab, gw):
    """The canary leaves the gateway's rotation before its benches (which measure it alone) and comes
    back once accepted; the other host then rolls with the usual drain. Clients see no failure."""
    canary, other = lab.hosts[1], lab.hosts[2]
    seen: list[set[str]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            seen.append({url for url, ok in listed(gw).items() if ok})
            time.sleep(0.2)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with Load(gw.url, clients=2) as load:
            limit = f"{canary.name},{other.name}"
            done = orchestrator(
                "deploy", "-i", str(gw.inventory), "--profile", GOOD, "--limit", limit,
                "--force-restart", "--canary", timeout=600,
            )  # fmt: skip
    finally:
        stop.set()
        sampler.join()
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"canary {canary.name}:" in done.stderr and "accepted" in done.stderr
    # Out of rotation: the canary for its restart and both benches, the other host for its restart only.
    canary_out = sum(worker_url(canary) not in urls for urls in seen)
    other_out = sum(worker_url(other) not in urls for urls in seen)
    assert other_out > 5 and canary_out > other_out + 20, (canary_out, other_out, len(seen))
    assert not load.failed, dict(load.failed)
    assert listed(gw) == {worker_url(h): True for h in lab.hosts}
