"""What a healthy deployment looks like on a host, checked with testinfra.

Run by `orchestrator verify`, which passes each host's plan as JSON in $ORCH_VERIFY_PLANS and
the hosts through testinfra's Ansible backend (`--hosts=ansible://...`).
"""

from __future__ import annotations

import json
import os

import pytest


@pytest.fixture
def plan(host) -> dict:
    """This host's plan (a multi-node rank has its own). Read per test, not at import: one
    process may verify several plans in a row."""
    raw = os.environ.get("ORCH_VERIFY_PLANS")
    if not raw:
        pytest.skip("run through `orchestrator verify`")
    return json.loads(raw)[host.backend.host]


def _main_pid(host, plan) -> int:
    out = host.check_output(f"systemctl show {plan['unit_name']} --property=MainPID --value")
    return int(out.strip() or 0)


def test_unit_file_equals_the_plan(host, plan):
    unit = host.file(f"/etc/systemd/system/{plan['unit_name']}")
    assert unit.exists, "unit file missing"
    if unit.content_string != plan["unit"]:
        import difflib

        drift = difflib.unified_diff(
            plan["unit"].splitlines(), unit.content_string.splitlines(), "plan", "host", lineterm="", n=0
        )
        pytest.fail("unit drifted from the plan:\n" + "\n".join(list(drift)[2:12]))


def test_service_enabled_and_active(host, plan):
    service = host.service(plan["unit_name"])
    assert service.is_enabled, "not enabled"
    assert service.is_running, "not active"


def test_port_listens_and_health_is_200(host, plan):
    if plan["serves_http"]:
        assert host.socket(f"tcp://{plan['bind']}:{plan['port']}").is_listening, (
            f"port {plan['port']} not listening"
        )
    # A multi-node rank other than 0 serves no HTTP: its server's health is rank 0's.
    probe = (
        "import sys, urllib.request;"
        f"sys.stdout.write(str(urllib.request.urlopen({plan['health_url']!r}, timeout=5).status))"
    )
    result = host.run(f"python3 -c {json.dumps(probe)}")
    assert result.stdout.strip() == "200", f"/health: {result.stdout.strip() or result.stderr.strip()[-200:]}"


def test_server_argv_and_environment_match_the_plan(host, plan):
    pid = _main_pid(host, plan)
    assert pid, "no MainPID"
    argv = host.file(f"/proc/{pid}/cmdline").content.split(b"\0")[:-1]
    running = [a.decode() for a in argv]
    environ = dict(
        e.decode().split("=", 1) for e in host.file(f"/proc/{pid}/environ").content.split(b"\0") if b"=" in e
    )
    # systemd expands the API key's credential word to the unit's own credentials directory.
    credentials = environ.get("CREDENTIALS_DIRECTORY", "${CREDENTIALS_DIRECTORY}")
    planned = [a.replace("${CREDENTIALS_DIRECTORY}", credentials) for a in plan["argv"]]
    if running != planned:
        from orchestrator.plan import flags_of

        have, want = flags_of(running), flags_of(planned)
        diffs = [f"{k}: {have.get(k, '(unset)')} (plan: {want.get(k, '(unset)')})" for k in {*have, *want}]
        diffs = sorted(
            d for d in diffs if d.split(":")[0] and have.get(d.split(":")[0]) != want.get(d.split(":")[0])
        )
        if running[:3] != planned[:3]:
            diffs.insert(0, f"command {running[:3]} (plan: {planned[:3]})")
        pytest.fail("server argv differs from the plan: " + "; ".join(diffs))
    missing = {k: v for k, v in plan["environment"].items() if environ.get(k) != v}
    assert not missing, f"environment lacks {missing}"


def _cgroup_unit(cgroup: str, units: set[str]) -> str:
    """Which of `units` a /proc/PID/cgroup text puts the process in: a path component equal to
    its name (sglang.service is not sglang.service-b); '' for none."""
    for line in cgroup.splitlines():
        for part in line.split(":", 2)[-1].split("/"):
            if part in units:
                return part
    return ""


def test_only_the_server_holds_the_gpus(host, plan):
    """Only the plan's GPU set is looked at: another orchestrator unit of this host may use the
    other GPUs. On ours, a process of another unit is named as such."""
    index_of = {}
    for line in host.check_output("nvidia-smi --query-gpu=index,uuid --format=csv,noheader").splitlines():
        index, _, uuid = line.partition(",")
        index_of[uuid.strip()] = int(index)
    listed = host.run(f"ls -1 {plan['state_dir']}/units").stdout.split()
    units = {n.removesuffix(".json") for n in listed if n.endswith(".json")} | {plan["unit_name"]}
    out = host.check_output(
        "nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv,noheader,nounits"
    )
    held = []
    for line in filter(None, out.splitlines()):
        cells = [c.strip() for c in line.split(",")]  # a process name may hold commas
        pid, name, mib, gpu = cells[0], ",".join(cells[1:-2]), cells[-2], index_of.get(cells[-1])
        if gpu not in plan["gpus"]:
            continue
        owner = _cgroup_unit(host.run(f"cat /proc/{pid}/cgroup").stdout, units)
        if owner != plan["unit_name"]:
            of = f" of {owner}, another orchestrator unit on this host" if owner else ""
            held.append(f"GPU {gpu}: PID {pid} {name} {mib} MiB{of}")
    assert not held, f"GPUs {plan['gpus']} held outside {plan['unit_name']}: {'; '.join(held)}"
