"""roles/sglang_gateway and roles/sglang_drain against the real gateway (`smg` 1.x, and
sglang-router 0.3.2 before it: each test runs on both) and real SGLang stand-in servers on loopback:
out of rotation, drain, prove, back in rotation."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hostfakes import load_module

from tests.unit.smgs import Smg, params
from tests.unit.test_standin_sglang import Lab, free_port


class Fleet:
    """Two stand-in servers behind one smg (its control plane behind `admin_key` when given)."""

    def __init__(self, root: Path, smg: Smg, admin_key: str = "") -> None:
        self.lab, self.version = Lab(root), smg
        # One after the other: two servers starting at once on one GPU each see the other's memory
        # as taken while they size their pools, and one dies "Not enough memory", as SGLang does.
        self.servers = []
        for _ in range(2):
            self.servers.append(self.lab.start("--mem-fraction-static", "0.3"))
            self.servers[-1].wait_ready(timeout=30)
        self.urls = [f"http://127.0.0.1:{s.port}" for s in self.servers]
        port = free_port()
        argv = [smg.program, "launch", "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin"]
        # smg's Prometheus exporter binds 0.0.0.0:29000 unless told otherwise: one per smg.
        argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
        if admin_key:  # smg's format: id:name:role:key
            argv += ["--control-plane-api-keys", f"ops:deploys:admin:{admin_key}"]
        self.admin_key = admin_key
        self.smg = subprocess.Popen(
            [*argv, "--log-level", "warn", "--worker-urls", *self.urls],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while self.healthy() != set(self.urls):
            assert time.monotonic() < deadline, "smg did not list both workers healthy"
            time.sleep(0.2)

    def healthy(self) -> set[str]:
        auth = {"Authorization": f"Bearer {self.admin_key}"} if self.admin_key else {}
        try:
            workers = httpx.get(f"{self.url}/workers", headers=auth, timeout=2).json()["workers"]
        except httpx.HTTPError:
            return set()
        return {w["url"] for w in workers if w["is_healthy"]}

    def close(self) -> None:
        self.smg.terminate()
        self.smg.wait(timeout=10)
        self.lab.close()


@pytest.fixture(scope="module", params=params())
def smg(request: pytest.FixtureRequest) -> Smg:
    return request.param


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, smg: Smg) -> Iterator[Fleet]:
    made = Fleet(tmp_path_factory.mktemp("fleet"), smg)
    yield made
    made.close()


@pytest.fixture
def gateway():
    return load_module("sglang_gateway")


@pytest.fixture
def drain():
    return load_module("sglang_drain")


def test_out_of_rotation_and_back(fleet, gateway, run_module):
    worker = fleet.urls[0]
    args = {"url": fleet.url, "worker_url": worker, "state": "absent", "timeout_s": 10}
    failed, result = run_module(gateway, args)
    assert not failed and result["changed"] and result["drain"] is True, result  # taken out: drain it
    ready = {"status": "ready"} if fleet.version.states else {}
    assert result["before"] == {"listed": True, "is_healthy": True, "load": 0, **ready}
    assert result["after"] == {"listed": False}  # 1.x lists it draining a while: out all the same
    assert fleet.healthy() == {fleet.urls[1]}
    for _ in range(4):  # round robin over what is left: all to the other server
        r = httpx.post(f"{fleet.url}/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 4}})
        assert r.status_code == 200
    again = run_module(gateway, args)[1]
    assert again["changed"] is False and again["drain"] is False  # already out: left as it is
    # Back at once: 1.x still lists it draining (and refuses a POST for it), so it waits that out.
    failed, result = run_module(gateway, {**args, "state": "present", "timeout_s": 30})
    assert not failed and result["changed"] and result["after"]["is_healthy"] and not result["drain"]
    assert fleet.healthy() == set(fleet.urls)
    assert run_module(gateway, {**args, "state": "present"})[1]["changed"] is False


def test_check_mode_says_what_it_would_do_and_does_nothing(fleet, gateway, run_module):
    args = {"url": fleet.url, "worker_url": fleet.urls[1] + "/", "state": "absent"}
    failed, result = run_module(gateway, args, check_mode=True)
    assert not failed and result["changed"] and result["before"]["listed"]
    assert fleet.healthy() == set(fleet.urls)


def test_a_gateway_that_does_not_answer_fails_naming_it(gateway, run_module):
    url = f"http://127.0.0.1:{free_port()}"
    failed, result = run_module(gateway, {"url": url, "worker_url": "http://127.0.0.1:1", "state": "absent"})
    assert failed and result["msg"].startswith(f"gateway {url}: GET {url}/workers: no answer")


def test_drain_waits_for_the_request_in_flight(fleet, drain, run_module):
    server = fleet.urls[1]
    long = threading.Thread(
        target=httpx.post,
        args=(f"{server}/generate",),
        kwargs={"json": {"text": "x", "sampling_params": {"max_new_tokens": 600}}, "timeout": 60},
    )
    long.start()
    time.sleep(0.5)
    start = time.monotonic()
    failed, result = run_module(drain, {"url": server, "mode": "drain", "timeout_s": 30})
    took = time.monotonic() - start
    long.join()
    assert not failed and result["in_flight"] == 0 and not result["timed_out"], result
    assert took > 0.5  # it waited for the request (600 tokens at the stand-in's speed), then went on


def test_drain_timeout_reports_what_is_still_in_flight(fleet, drain, run_module):
    server = fleet.urls[1]
    body = {"text": "x", "sampling_params": {"max_new_tokens": 3000}}
    long = threading.Thread(
        target=httpx.post, args=(f"{server}/generate",), kwargs={"json": body, "timeout": 60}
    )
    long.start()
    time.sleep(0.5)
    failed, result = run_module(drain, {"url": server, "mode": "drain", "timeout_s": 1})
    long.join()
    assert not failed and result["timed_out"] and result["in_flight"] == 1, result


def test_a_stopped_server_has_nothing_in_flight(drain, run_module):
    failed, result = run_module(drain, {"url": f"http://127.0.0.1:{free_port()}", "mode": "drain"})
    assert not failed and result["in_flight"] == 0 and not result["timed_out"]


def test_prove_wants_health_generate(fleet, drain, run_module):
    failed, result = run_module(drain, {"url": fleet.urls[0], "mode": "prove", "timeout_s": 5})
    assert not failed and result["status"] == 200
    failed, result = run_module(
        drain, {"url": f"http://127.0.0.1:{free_port()}", "mode": "prove", "timeout_s": 1}
    )
    assert failed and "cannot generate; it was not put back in rotation" in result["msg"]


def test_a_gateway_with_an_admin_key_wants_it_and_takes_it(tmp_path, smg, gateway, run_module):
    """smg --control-plane-api-keys: without orchestrator_gateway_api_key the module fails saying so;
    with it, the worker goes out and back."""
    keyed = Fleet(tmp_path, smg, admin_key="s3cret")
    try:
        args = {"url": keyed.url, "worker_url": keyed.urls[0], "state": "absent", "timeout_s": 10}
        failed, result = run_module(gateway, args)
        assert failed and "401: the gateway wants its admin API key" in result["msg"], result
        assert "set orchestrator_gateway_api_key in the inventory" in result["msg"]
        assert keyed.healthy() == set(keyed.urls)
        failed, result = run_module(gateway, {**args, "api_key": "s3cret"})
        assert not failed and result["changed"] and keyed.healthy() == {keyed.urls[1]}
        failed, result = run_module(
            gateway, {**args, "state": "present", "api_key": "s3cret", "timeout_s": 30}
        )
        assert not failed and result["after"]["is_healthy"] and keyed.healthy() == set(keyed.urls)
    finally:
        keyed.close()


def test_the_check_before_a_deploy_names_a_missing_admin_key_and_a_host_not_listed(tmp_path, smg):
    """hosts/rotation.py's check, the same client from the control machine: nothing is stopped."""
    from orchestrator.errors import InputError
    from orchestrator.hosts import rotation
    from orchestrator.hosts.playvars import GatewayPlan

    keyed = Fleet(tmp_path, smg, admin_key="s3cret")
    try:
        plans = {
            "gpu1": GatewayPlan(url=keyed.url, worker_url=keyed.urls[0], server_url=keyed.urls[0]),
            "gpu2": GatewayPlan(url=keyed.url, worker_url="http://127.0.0.1:1", server_url="http://x"),
        }
        with pytest.raises(
            InputError, match=r"refused the list of workers: .*401: the gateway wants its admin"
        ):
            rotation.check(plans, {})
        with pytest.raises(InputError) as refused:
            rotation.check(plans, {"gpu1": "s3cret", "gpu2": "s3cret"})
        assert str(refused.value).startswith("nothing was stopped: gpu2: http://127.0.0.1:1 is not a worker")
        assert "gpu1" not in str(refused.value)
        rotation.check({"gpu1": plans["gpu1"]}, {"gpu1": "s3cret"})
    finally:
        keyed.close()
