"""Run the shipped testinfra tests against an inventory and collect pass/fail per host and check."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.hosts import ansible_config, vault
from orchestrator.hosts import inventory as inventory_mod
from orchestrator.hosts.playvars import HostPaths, UnitFacts, placements
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch

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
        """A check that does not apply (skipped: the host runtime's container check) is not listed."""
        if report.skipped:
            return
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


def plan_json(plan: launch.Plan, facts: UnitFacts) -> dict[str, object]:
    """What test_deployment.py checks one host against. A multi-node rank other than 0 serves
    no HTTP (`serves_http`: false); its server's /health is rank 0's. `gpus` is the unit's GPU
    set, `state_dir` where the host keeps every orchestrator unit's facts (its neighbours). A
    container runtime adds its `engine`, `container` and `image` (the run command's last word)."""
    out: dict[str, object] = {
        **plan.to_json(),
        "unit_name": plan.unit_name,
        "port": facts.port,
        "bind": facts.bind,
        "health_url": facts.health_url,
        "serves_http": facts.rank == 0,
        "digest": plan.digest,
        "gpus": facts.gpus,
        "state_dir": HostPaths().state_dir,
        "runtime": plan.runtime,
    }
    if plan.engine_argv:
        out.update(
            engine=plan.engine_argv[0],
            container=plan.unit_name.removesuffix(".service"),  # container.name's rule
            image=plan.engine_argv[-1],
        )
    return out


def pd_json(prof: profile_mod.Profile, inventory: Path) -> dict[str, object]:
    """A PD server's role and bootstrap port; a decode server's prefill peers, as the inventory's
    prefill group names them (address:bootstrap port), which it must reach as SGLang's heartbeat does."""
    pd = prof.disaggregation
    assert pd is not None
    peers = []
    if pd.mode == "decode":
        for h in inventory_mod.hosts(inventory):
            if h.pd_role == "prefill":
                address = f"[{h.address}]" if ":" in h.address else h.address
                peers.append(f"{address}:{pd.bootstrap_port}")
    return {"role": pd.mode, "bootstrap_port": pd.bootstrap_port, "peers": peers}


def verify(prof: profile_mod.Profile, inventory: Path, limit: str | None = None) -> list[Check]:
    """Every check on every host of `inventory` (or those `limit` names), for this profile's plan
    as deploy places it on each host (a multi-node rank gets its own)."""
    plans = {name: plan_json(p.plan, p.facts) for name, p in placements(prof, inventory, limit).items()}
    if prof.disaggregation is not None:
        for plan in plans.values():
            plan["pd"] = pd_json(prof, inventory)
    if not plans:  # testinfra knows no Ansible patterns: the hosts are named one by one
        return []
    collector = _Collector()
    args = [
        str(TESTS),
        "--hosts=" + ",".join(f"ansible://{name}" for name in plans),
        f"--ansible-inventory={inventory}",
        "-p",
        "testinfra.plugin",  # the one plugin: autoloading every installed one cost 1.2 s
        "-p",
        "no:cacheprovider",
        "-q",
        "--rootdir",
        str(TESTS.parent),
    ]
    env = {
        "ORCH_VERIFY_PLANS": json.dumps(plans),
        "PATH": _path_first_ours(),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    _give_testinfra(inventory, list(plans))
    with _environ(env), contextlib.redirect_stdout(io.StringIO()):
        pytest.main(args, plugins=[collector])
    return collector.checks


def _path_first_ours() -> str:
    """PATH with this Python's scripts directory first: testinfra starts `ansible-inventory` and
    `ansible` by name, and under pipx (or an unactivated venv) ours are on no PATH."""
    ours = sysconfig.get_path("scripts")
    path = os.environ.get("PATH", os.defpath)
    return os.pathsep.join([ours, *(p for p in path.split(os.pathsep) if p and p != ours)])


def _give_testinfra(inventory: Path, names: list[str]) -> None:
    """testinfra would read the inventory with `ansible-inventory --list`, which knows none of the command
    line's vault passwords, and takes ssh_args only from ansible.cfg: it gets the hosts' connection
    variables as orchestrator read them (decrypted where vaulted), and the user's ssh_args where they come
    from ANSIBLE_SSH_ARGS (a ProxyJump there reaches verify too)."""
    from testinfra.utils.ansible_runner import AnsibleRunner

    found = inventory_mod.host_variables(inventory)
    hostvars = {
        name: {k: vault.plain(v, k) for k, v in found[name].items() if k.startswith("ansible_")}
        for name in names
    }
    runner = AnsibleRunner.get_runner(str(inventory))
    runner.__dict__["inventory"] = {"_meta": {"hostvars": hostvars}, "all": {"hosts": list(hostvars)}}
    runner._host_cache.clear()
    parser = runner.ansible_config
    if not parser.has_section("ssh_connection"):
        parser.add_section("ssh_connection")
    if not parser.get("ssh_connection", "control_path", fallback="", raw=True):
        # One ssh connection per host for all its checks, as Ansible keeps one: testinfra asks for
        # ControlMaster but names no ControlPath, so each check paid a new handshake (13 per host).
        # Where that folder cannot be made, each check opens its own connection, as before.
        cp_dir = Path(parser.get("persistent_connection", "control_path_dir", fallback="~/.ansible/cp"))
        with contextlib.suppress(OSError):
            cp_dir.expanduser().mkdir(mode=0o700, parents=True, exist_ok=True)
        if not parser.has_section("persistent_connection"):
            parser.add_section("persistent_connection")
        parser.set("persistent_connection", "control_path_dir", str(cp_dir).replace("%", "%%"))
        parser.set("ssh_connection", "control_path", "%(directory)s/ti-%%C")  # short: a socket path
    ssh_args = ansible_config.read()["ssh.ssh_args"]
    if ssh_args.origin.startswith("env:"):
        parser.set("ssh_connection", "ssh_args", str(ssh_args.value).replace("%", "%%"))


@contextlib.contextmanager
def _environ(extra: dict[str, str]) -> Iterator[None]:
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
