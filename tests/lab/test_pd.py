"""A prefill/decode fleet behind SGLang's real gateway (`smg --pd-disaggregation`): deployed as one
service, benched through the gateway, rolled one decode server at a time under load, and put back
in rotation after a server died outside orchestrator (docs/pd.md).

One fleet serves the module, grown as it goes: 1 prefill + 1 decode first, then 2 + 2."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections import Counter

import httpx
import pytest
from test_gateway import Load

from labutil import orchestrator, service, ssh, write_profile
from orchestrator.lab import gateway as lab_gateway

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(shutil.which("smg") is None, reason="needs smg: pip install 'orchestrator[gateway]'"),
]

PROFILES = ("-p", "pd_prefill", "-p", "pd_decode")
#: smg checks each worker every second, and marks it not ready after 2 misses.
HEALTH_S = 1


def workers(gw) -> dict[str, dict]:
    """{worker URL: its entry} as smg lists them now."""
    return {w["url"]: w for w in httpx.get(f"{gw.url}/workers", timeout=10).json()["workers"]}


def ready(gw, count: int, timeout_s: float = 60) -> dict[str, dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        listed = workers(gw)
        if sum(w["status"] == "ready" for w in listed.values()) == count or time.monotonic() > deadline:
            return listed
        time.sleep(0.3)


def run_json(*args: str) -> tuple[int, dict]:
    done = orchestrator(*args, "--json", timeout=600)
    try:
        return done.returncode, json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"rc {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}") from None


def url_of(host) -> str:
    return f"http://{host.address}:30000"


@pytest.fixture(scope="module")
def decode8(tmp_path_factory) -> str:
    """New decode settings: 4 steps and 8 draft tokens where pd_decode has 3 and 5."""
    return write_profile(
        tmp_path_factory.mktemp("pd"),
        "pd_decode_8tok",
        "extends: pd_decode\nspeculative: {num_steps: 4, eagle_topk: 4, num_draft_tokens: 8}\n",
    )


@pytest.fixture(scope="module")
def fleet(lab):
    """lab1 prefill and lab3 decode behind smg in PD mode, deployed through it. The servers an earlier
    test left are stopped first: a fleet of one server per role cannot roll, only start."""
    done = orchestrator("stop", "-i", str(lab.inventory))
    assert done.returncode == 0, done.stdout + done.stderr
    gw = lab_gateway.up(pd=lab_gateway.PdSplit(("lab1",), ("lab3",)), health_interval_s=HEALTH_S)
    rc, report = run_json("deploy", "-i", str(gw.inventory), *PROFILES)
    assert rc == 0, report
    yield gw
    lab_gateway.down()


def test_one_prefill_and_one_decode_serve_through_the_gateway(lab, fleet):
    by_name = {h.name: h for h in lab.hosts}
    listed = ready(fleet, 2)
    assert {u: (w["worker_type"], w["status"]) for u, w in listed.items()} == {
        url_of(by_name["lab1"]): ("prefill", "ready"),
        url_of(by_name["lab3"]): ("decode", "ready"),
    }
    assert listed[url_of(by_name["lab1"])]["bootstrap_port"] == 8998

    rc, row = run_json(
        "bench", "-i", str(fleet.inventory), "--gateway", "-n", "8", "-c", "4", "--warmup", "1"
    )
    assert rc == 0, row
    assert row["result"] == "ok" and row["errors"] == 0 and row["tok_s"] > 0, row
    assert row["profile"] == "pd_prefill+pd_decode" and row["host"] == "lab3"
    servers = {s["host"]: (s["role"], s["profile"]) for s in json.loads(row["fleet"])["servers"]}
    assert servers == {"lab1": ("prefill", "pd_prefill"), "lab3": ("decode", "pd_decode")}
    assert row["accept_len"] and row["accept_len"] > 1  # the decode server's EAGLE3 drafts

    rc, checks = run_json("verify", "-i", str(fleet.inventory))
    assert rc == 0, [c for c in checks["checks"] if not c["passed"]]
    assert checks["profile"] == "pd_prefill+pd_decode"
    names = {(c["host"], c["check"]) for c in checks["checks"]}
    assert ("lab1", "prefill bootstrap server answers") in names
    assert ("lab3", "decode reaches its prefill peers") in names

    status = orchestrator("status", "-i", str(fleet.inventory), "--json")
    roles = {r["host"]: r["pd"].get("role") for r in json.loads(status.stdout)}
    assert roles == {"lab1": "prefill", "lab2": None, "lab3": "decode", "lab4": None}


class Roles(threading.Thread):
    """The fewest workers of each role smg listed ready, polled until stopped."""

    def __init__(self, gw) -> None:
        super().__init__(daemon=True)
        self.gw, self.stop, self.least = gw, threading.Event(), Counter[str]()
        self.seen = False

    def run(self) -> None:
        while not self.stop.is_set():
            counts = Counter(w["worker_type"] for w in workers(self.gw).values() if w["status"] == "ready")
            for role in ("prefill", "decode"):
                self.least[role] = min(self.least.get(role, 99), counts[role])
            self.seen = True
            time.sleep(0.1)


def test_a_rolling_deploy_of_new_decode_settings_loses_no_request(lab, fleet, decode8):
    gw = lab_gateway.up(
        pd=lab_gateway.PdSplit(("lab1", "lab2"), ("lab3", "lab4")), health_interval_s=HEALTH_S
    )
    rc, report = run_json("deploy", "-i", str(gw.inventory), *PROFILES)  # grows to 2 + 2
    assert rc == 0, report
    assert {h["host"]: h["restarted"] for h in report["hosts"]} == {
        "lab1": False,
        "lab2": True,
        "lab3": False,
        "lab4": True,
    }
    assert sorted(w["status"] for w in ready(gw, 4).values()) == ["ready"] * 4

    before = {h.name: service(h)["MainPID"] for h in lab.hosts}
    roles = Roles(gw)
    with Load(gw.url) as load:
        roles.start()
        time.sleep(2)
        rc, report = run_json("deploy", "-i", str(gw.inventory), "-p", "pd_prefill", "-p", decode8)
        time.sleep(1)
        roles.stop.set()
    assert rc == 0, report
    assert load.sent > 40 and not load.failed, f"{load.sent} sent, failed: {dict(load.failed)}"
    assert roles.seen and roles.least == {"prefill": 2, "decode": 1}, roles.least  # one decode at a time
    after = {h.name: service(h)["MainPID"] for h in lab.hosts}
    assert [h for h in after if after[h] != before[h]] == ["lab3", "lab4"]  # prefill stayed
    back = {r["host"]: r["gateway"]["back"]["after"] for r in report["hosts"] if r["restarted"]}
    assert set(back) == {"lab3", "lab4"} and all(b["status"] == "ready" for b in back.values())
    assert sorted(w["status"] for w in ready(gw, 4).values()) == ["ready"] * 4


def test_a_decode_server_killed_outside_the_tool_is_put_back_by_a_deploy(lab, fleet, decode8):
    gw = lab_gateway.state()
    assert gw is not None
    lab4 = next(h for h in lab.hosts if h.name == "lab4")
    ssh(lab4, "kill -9 $(systemctl show -p MainPID --value sglang.service)")  # as the OOM killer would
    deadline = time.monotonic() + 30
    while workers(gw)[url_of(lab4)]["status"] != "failed":
        assert time.monotonic() < deadline, workers(gw)[url_of(lab4)]
        time.sleep(0.5)

    rc, report = run_json("deploy", "-i", str(gw.inventory), "-p", "pd_prefill", "-p", decode8)
    assert rc == 0, report
    lab4_report = next(r for r in report["hosts"] if r["host"] == "lab4")
    assert lab4_report["restarted"] and lab4_report["gateway"]["out"]["before"]["status"] == "failed"
    assert workers(gw)[url_of(lab4)]["status"] == "ready"
    assert sorted(w["status"] for w in workers(gw).values()) == ["ready"] * 4
