"""SGLang's gateway `smg`, run for real in front of two SGLang stand-ins on 127.0.0.1, each test on
both releases installed (smg 1.x and sglang-router 0.3.2, tests/unit/smgs.py): the worker API that
draining stands on, the lab gateway's Python API and CLI, and the rollout benchmark's load
generator through it. No lab needed.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from smgs import PREVIOUS, Smg, params
from test_standin_sglang import Lab, Server, free_port

from orchestrator.cli.lab_command import lab as lab_cli
from orchestrator.errors import InputError, OrchestratorError
from orchestrator.lab import gateway as lab_gateway
from orchestrator.lab import nspawn

CHECKOUT = Path(__file__).resolve().parents[2]
BENCHMARKS = CHECKOUT / "benchmarks"
#: The stand-in's text for 5 tokens (its words, in turn).
FIVE_TOKENS = " the lab host serves tokens"
#: Long enough to be in flight through a DELETE and a few short requests (300 tok/s: about 2 s).
LONG_TOKENS = 600


@dataclass
class Stack:
    """Two stand-in servers (metrics on) and one smg routing round robin to both."""

    lab: Lab
    servers: list[Server]
    gateway: Server
    smg: subprocess.Popen[bytes]
    version: Smg

    def url(self, server: Server) -> str:
        return f"http://127.0.0.1:{server.port}"

    def listed(self) -> dict[str, dict]:
        return {w["url"]: w for w in self.gateway.json("GET", "/workers")["workers"]}

    def wait_listed(self, urls: set[str], timeout: float = 15) -> dict[str, dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            listed = self.listed()
            if {url for url, w in listed.items() if w["is_healthy"]} == urls:
                return listed
            time.sleep(0.1)
        raise AssertionError(f"smg lists {self.listed()}, not {urls} healthy")

    def wait_out(self, url: str, timeout: float = 5) -> dict | None:
        """Until smg no longer routes to `url` after its DELETE (202, done a moment later): 0.3.2
        drops it from the list, 1.x lists it `draining`; how it is listed then (None: not)."""
        deadline = time.monotonic() + timeout
        while (w := self.listed().get(url)) is not None and w.get("status") != "draining":
            assert time.monotonic() < deadline, f"smg still lists {w} {timeout} s after its DELETE"
            time.sleep(0.05)
        return w


def generated_tokens(server: Server) -> float:
    """generation_tokens_total from the server's /metrics: how much it has generated, ever."""
    text = server.request("GET", "/metrics").read().decode()
    line = next(line for line in text.splitlines() if line.startswith("sglang:generation_tokens_total{"))
    return float(line.split()[-1])


def free_gateway_port() -> int:
    """A free port whose next port is free too: the lab gateway puts its Prometheus on port + 1."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no free pair of ports on 127.0.0.1 in 50 tries")


def start_smg(smg: Smg, workers: list[str], log: Path) -> tuple[subprocess.Popen[bytes], Server]:
    port, metrics = free_port(), free_port()
    argv = [smg.program, "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers]
    argv += ["--policy", "round_robin", "--log-level", "warn"]
    argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics)]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    return proc, Server(proc, port)  # type: ignore[arg-type]


@pytest.fixture(scope="module", params=params())
def stack(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("gateway")
    lab = Lab(root / "root")
    smg = None
    try:
        # One after the other: two servers starting at once on one GPU each see the other's memory
        # as taken while they size their pools, and one dies "Not enough memory", as SGLang does.
        servers = []
        for i in range(2):
            servers.append(
                lab.start(
                    "--tp-size",
                    "1",
                    "--mem-fraction-static",
                    "0.3",
                    "--enable-metrics",
                    log=root / f"s{i}.log",
                )
            )
            servers[-1].wait_ready()
        smg, gateway = start_smg(
            request.param, [f"http://127.0.0.1:{s.port}" for s in servers], root / "smg.log"
        )
        gateway.wait_ready()
        stack = Stack(lab, servers, gateway, smg, request.param)
        stack.wait_listed({stack.url(s) for s in servers})
        yield stack
    finally:
        if smg is not None:
            smg.kill()
            smg.wait()
        lab.close()


# --- the installed smg's worker API ------------------------------------------------------------


def test_the_installed_smg_is_the_release_the_gateway_extra_asks_for() -> None:
    extras = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["gateway"] == [lab_gateway.SMG_REQUIREMENT] == ["smg>=1.13,<2"]
    assert lab_gateway.SMG_REQUIREMENT in extras["test"]  # CI installs '.[test]'
    major, minor = (int(n) for n in importlib.metadata.version("smg").split(".")[:2])
    assert major == 1 and minor >= 13
    said = subprocess.run(["smg", "--version"], capture_output=True, text=True, timeout=30)
    assert said.stdout.strip() == f"smg {importlib.metadata.version('smg')}"


def test_the_release_before_is_installed_beside_it() -> None:
    """scripts/setup.sh --test's venv of sglang-router 0.3.2 (its `smg` would overwrite 1.x's)."""
    assert os.access(PREVIOUS, os.X_OK), f"{PREVIOUS}: no smg there: run scripts/setup.sh --test"
    assert lab_gateway.SMG_PREVIOUS == "sglang-router==0.3.2"
    said = subprocess.run([PREVIOUS, "--version"], capture_output=True, text=True, timeout=30)
    assert said.stdout.strip() == "sgl-model-gateway 0.3.2"


def test_both_workers_are_listed_healthy_and_answer_through_it(stack: Stack) -> None:
    listed = stack.listed()
    assert set(listed) == {stack.url(s) for s in stack.servers}
    assert all(w["is_healthy"] and w["id"] for w in listed.values())
    if stack.version.states:
        assert {w["status"] for w in listed.values()} == {"ready"}
    assert stack.gateway.json("GET", "/readiness") == {
        "status": "ready",
        "healthy_workers": 2,
        "total_workers": 2,
    }
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 5}}
    whole = stack.gateway.json("POST", "/generate", body)
    assert (whole["text"], whole["meta_info"]["completion_tokens"]) == (FIVE_TOKENS, 5)
    events = stack.gateway.request("POST", "/generate", {**body, "stream": True}).read().decode()
    assert events.split("\n\n")[-2:] == ["data: [DONE]", ""]


def test_a_deleted_worker_finishes_in_flight_and_gets_nothing_new_until_added_back(stack: Stack) -> None:
    long = {"text": "x", "sampling_params": {"max_new_tokens": LONG_TOKENS}, "stream": True}
    in_flight = stack.gateway.request("POST", "/generate", long)
    assert in_flight.status == 200 and in_flight.read(6) == b"data: "
    loads = {s.port: s.json("GET", "/get_load")[0]["num_reqs"] for s in stack.servers}
    victim, other = sorted(stack.servers, key=lambda s: -loads[s.port])
    assert (loads[victim.port], loads[other.port]) == (1, 0)

    worker_id = stack.listed()[stack.url(victim)]["id"]
    resp = stack.gateway.request("DELETE", f"/workers/{worker_id}")
    assert (resp.status, json.loads(resp.read())["status"]) == (202, "accepted")
    out = stack.wait_out(stack.url(victim))  # out of rotation (asynchronously: 202)
    if stack.version.states:  # listed while its request runs, routed nothing
        assert out is not None and (out["status"], out["is_healthy"]) == ("draining", False)
    else:
        assert out is None and set(stack.listed()) == {stack.url(other)}

    before = generated_tokens(other)
    short = {"text": "x", "sampling_params": {"max_new_tokens": 8}}
    for _ in range(6):
        assert stack.gateway.json("POST", "/generate", short)["meta_info"]["completion_tokens"] == 8
    assert generated_tokens(other) - before == 6 * 8  # every new request went to the other worker
    assert victim.json("GET", "/get_load")[0]["num_reqs"] == 1  # still only the one in flight

    last = in_flight.read().decode().split("\n\n")
    assert last[-2:] == ["data: [DONE]", ""]
    assert json.loads(last[-3].removeprefix("data: "))["meta_info"]["completion_tokens"] == LONG_TOKENS

    if stack.version.states:  # 1.x: refused while it is still listed draining; gone a while after
        resp = stack.gateway.request("POST", "/workers", {"url": stack.url(victim)})
        assert resp.status == 409 and "already exists" in resp.read().decode()
        deadline = time.monotonic() + 15
        while stack.url(victim) in stack.listed():
            assert time.monotonic() < deadline, stack.listed()
            time.sleep(0.1)
    resp = stack.gateway.request("POST", "/workers", {"url": stack.url(victim)})
    assert (resp.status, json.loads(resp.read())["status"]) == (202, "accepted")
    stack.wait_listed({stack.url(s) for s in stack.servers})
    before = [generated_tokens(s) for s in stack.servers]
    for _ in range(4):
        stack.gateway.json("POST", "/generate", short)
    assert [generated_tokens(s) - b for s, b in zip(stack.servers, before, strict=True)] == [16, 16]


# --- the lab gateway: orchestrator.lab.gateway and `lab gateway` ---------------------------------


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def write_lab_inventory(addresses: list[str]) -> Path:
    """inventory.yml as `lab up` writes it, for hosts at `addresses`."""
    hosts = {f"lab{i}": {"ansible_host": a, "ansible_user": "root"} for i, a in enumerate(addresses, 1)}
    path = nspawn.lab_dir() / "inventory.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "# Written by `orchestrator lab up`.\n"
        + yaml.safe_dump({"all": {"children": {"lab": {"hosts": hosts}}}})
    )
    return path


def test_lab_gateway_up_status_and_down(stack: Stack, state_dir: Path) -> None:
    server = stack.servers[0]
    write_lab_inventory(["127.0.0.1"])
    port = free_gateway_port()
    state = lab_gateway.up(port=port, worker_port=server.port, smg=stack.version.program)
    try:
        url = f"http://127.0.0.1:{port}"
        assert (state.url, state.workers, state.reused) == (url, (stack.url(server),), False)
        assert lab_gateway.state() == state
        inventory = yaml.safe_load(state.inventory.read_text())
        assert inventory["all"]["vars"] == {"orchestrator_gateway_url": url}
        assert inventory["all"]["children"]["lab"]["hosts"]["lab1"]["ansible_host"] == "127.0.0.1"
        assert state.inventory.read_text().startswith("# Written by `orchestrator lab gateway up`")

        again = lab_gateway.up(port=port, worker_port=server.port, smg=stack.version.program)
        assert (again.pid, again.reused) == (state.pid, True)
        first, port = state, free_gateway_port()
        state = lab_gateway.up(port=port, worker_port=server.port, smg=stack.version.program)  # a new smg
        assert not state.reused and nspawn._proc_start(first.pid) is None
        url = f"http://127.0.0.1:{port}"
        assert yaml.safe_load(state.inventory.read_text())["all"]["vars"] == {"orchestrator_gateway_url": url}

        shown = CliRunner().invoke(lab_cli, ["gateway", "status"])
        assert shown.exit_code == 0, shown.output
        assert url in shown.stdout and f"pid {state.pid}" in shown.stdout
        row = next(line for line in shown.stdout.splitlines() if stack.url(server) in line)
        assert row.split("│")[2].strip() == "yes", shown.stdout
    finally:
        assert lab_gateway.down() is True
    assert lab_gateway.state() is None and not state.inventory.exists()
    assert not (nspawn.lab_dir() / "gateway.json").exists()
    assert nspawn._proc_start(state.pid) is None  # smg is gone, not only forgotten
    gone = CliRunner().invoke(lab_cli, ["gateway", "status"])
    assert (gone.exit_code, gone.stdout) == (1, "no gateway; start one with `lab gateway up`\n")
    assert lab_gateway.down() is False
    assert lab_gateway.down in nspawn.ON_DOWN  # `lab down` stops it first


def test_lab_gateway_up_names_the_workers_that_do_not_serve_and_stops_smg(
    stack: Stack, state_dir: Path
) -> None:
    server = stack.servers[1]
    write_lab_inventory(["127.0.0.1", "127.0.0.2"])  # nothing listens on 127.0.0.2
    with pytest.raises(OrchestratorError) as failed:
        lab_gateway.up(
            port=free_gateway_port(), worker_port=server.port, timeout_s=3, smg=stack.version.program
        )
    assert f"the gateway's workers http://127.0.0.2:{server.port} are not serving after 3 s" in str(
        failed.value
    )
    assert "deploy first: python -m orchestrator deploy -i " in str(failed.value)
    assert lab_gateway.state() is None and not lab_gateway.inventory_path().exists()
    assert not (nspawn.lab_dir() / "gateway.json").exists()


def test_lab_gateway_without_smg_or_a_lab_says_what_to_do(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InputError, match=r"no lab is up: run `orchestrator lab up` first"):
        lab_gateway.up()
    monkeypatch.setenv("PATH", str(state_dir / "empty"))
    shown = CliRunner().invoke(lab_cli, ["gateway", "up"])
    assert shown.exit_code == 2
    assert shown.stderr == (
        "error: the lab gateway runs SGLang's `smg`, which is not installed: "
        "pip install 'orchestrator[gateway]' (or pip install 'smg>=1.13,<2')\n"
    )
    shown = CliRunner().invoke(lab_cli, ["gateway", "up", "--smg", "/nowhere/smg"])
    assert (shown.exit_code, shown.stderr) == (
        2,
        "error: --smg /nowhere/smg: no such program (give the path of an smg executable)\n",
    )


# --- the rollout benchmark's load generator, through the real gateway ----------------------------


@pytest.fixture
def rollout(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the script imports _timing beside it
    spec = importlib.util.spec_from_file_location("rollout_under_load", BENCHMARKS / "rollout_under_load.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_load_through_the_gateway_adds_up(stack: Stack, rollout) -> None:
    url = f"http://127.0.0.1:{stack.gateway.port}"
    load = rollout.Load(url, clients=4, min_requests=40, max_new_tokens=32)
    load.start()
    time.sleep(1.0)
    seen = load.finish()
    assert seen.sent >= 40 and seen.sent == len(load.outcomes)
    assert (seen.ok, seen.failed_by_status, seen.failed_by_exception, seen.truncated) == (
        seen.sent,
        {},
        {},
        0,
    )
    assert sorted({o.stream for o in load.outcomes}) == [False, True]  # half stream, half do not
    assert 0 < seen.p50_ms <= seen.p99_ms


def test_the_benchmark_counts_truncated_streams_and_failures(rollout) -> None:
    done = ['data: {"meta_info": {"completion_tokens": 32}}', "", "data: [DONE]", ""]
    assert not rollout.stream_truncated(done, 32)
    assert rollout.stream_truncated(done[:2], 32)  # no [DONE]
    assert rollout.stream_truncated(['data: {"meta_info": {"completion_tokens": 31}}', "data: [DONE]"], 32)
    # smg 1.x ends a stream its worker cut with an error event, then [DONE] (captured from 1.13).
    cut = 'data: {"error":{"message":"Stream error: unexpected EOF","type":"stream_error"}}'
    assert rollout.stream_truncated([done[0], cut, "data: [DONE]"], 32)
    outcomes = [
        rollout.Outcome(True, 0.1, 200),
        rollout.Outcome(False, 0.3, 200),
        rollout.Outcome(False, 0.01, 503),
        rollout.Outcome(True, 0.01, 503),
        rollout.Outcome(True, 0.2, None, error="RemoteProtocolError"),
        rollout.Outcome(True, 0.2, 200, truncated=True),
    ]
    seen = rollout.LoadStats.of(outcomes)
    assert (seen.sent, seen.ok, seen.failed_by_status, seen.truncated) == (6, 2, {503: 2}, 1)
    assert seen.failed_by_exception == {"RemoteProtocolError": 1}
    assert (seen.p50_ms, seen.p99_ms) == pytest.approx((200.0, 298.0))
