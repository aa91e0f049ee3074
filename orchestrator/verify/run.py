"""Run the shipped testinfra tests against an inventory and collect pass/fail per host and check."""

from __future__ import annotations

import contextlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator import plan as plan_mod
from orchestrator import profile as profile_mod
from orchestrator.deploy import health_url, multinode_hosts, rank_plans
from orchestrator.inventory import host_names

TESTS = Path(__file__).with_name("test_deployment.py")


@dataclass
class Check:
    host: str
    check: str
    passed: bool
    message: str


class _Collector:
    """A pytest plugin keeping each test's outcome and its failure's first lines."""

    def __init__(self) -> None:
        self.checks: list[Check] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call" and not (report.when == "setup" and report.outcome != "passed"):
            return
        name, _, host = report.nodeid.split("::")[-1].partition("[")
        host = host.rstrip("]").removeprefix("ansible://")
        message = ""
        if report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            message = crash.message if crash else str(report.longrepr)[-300:]
            lines = message.removeprefix("AssertionError: ").removeprefix("Failed: ").splitlines()
            message = "\n".join(line for line in lines if not line.startswith(("assert ", " +")))
        check = name.removeprefix("test_").replace("_", " ")
        self.checks.append(Check(host, check, report.passed, message))


def plan_json(prof: profile_mod.Profile, plan: plan_mod.Plan, rank0: str = "") -> dict[str, object]:
    """What test_deployment.py checks one host against. A multi-node rank other than 0 serves
    no HTTP (`serves_http`: false); its server's /health is rank 0's, at `rank0`."""
    bind = prof.server.host
    url = health_url(plan, rank0 or bind)
    return {
        **plan.to_json(),
        "unit_name": plan.unit_name,
        "port": plan.port,
        "bind": bind,
        "health_url": url,
        "serves_http": not rank0,
        "digest": plan.digest,
    }


def host_plans(prof: profile_mod.Profile, inventory: Path, limit: str | None) -> dict[str, dict[str, object]]:
    """Each selected host's plan, as deploy would write it: a multi-node rank gets its own."""
    ranks = multinode_hosts(prof, inventory, limit)
    if not ranks:
        one = plan_json(prof, plan_mod.build(prof))
        return {name: one for name in host_names(inventory, limit)}
    plans = {}
    for rank, (host, plan) in enumerate(rank_plans(prof, ranks).items()):
        plans[host] = plan_json(prof, plan, ranks[0].address if rank else "")
    return plans


def verify(profile_ref: str, inventory: Path, limit: str | None = None) -> list[Check]:
    """Every check on every host of `inventory` (or those `limit` names), for this profile's plan."""
    prof = profile_mod.load(profile_ref)
    plans = host_plans(prof, inventory, limit)  # testinfra knows no Ansible patterns
    if not plans:
        return []
    collector = _Collector()
    args = [
        str(TESTS),
        "--hosts=" + ",".join(f"ansible://{name}" for name in plans),
        f"--ansible-inventory={inventory}",
        "-p",
        "no:cacheprovider",
        "-q",
        "--rootdir",
        str(TESTS.parent),
    ]
    env = {"ORCH_VERIFY_PLANS": json.dumps(plans)}
    with _environ(env), contextlib.redirect_stdout(io.StringIO()):
        pytest.main(args, plugins=[collector])
    return collector.checks


@contextlib.contextmanager
def _environ(extra: dict[str, str]):
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
