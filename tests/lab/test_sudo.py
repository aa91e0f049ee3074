"""Every command through a non-root login that becomes root with sudo, as real fleets log in.

`deploy` sudoes without a password (the lab's inventory-sudo.yml); `deploy-pw` needs the lab's
become password, given with -K on a terminal (pexpect: getpass reads the controlling tty);
`nosudo` may not sudo. Only the lab's last host is used. The password must appear nowhere:
not in `ps` during a run, not in any file of the state directory (runs, ledger, caches), not in
the host's journal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pexpect
import pytest
import yaml

from labutil import GOOD, orchestrator, service, ssh
from orchestrator.lab import nspawn
from orchestrator.paths import state_dir

pytestmark = pytest.mark.lab

LOAD = ["--requests", "2", "--concurrency", "2", "--max-tokens", "64", "--warmup", "1"]


@pytest.fixture(scope="module")
def host(lab):
    return lab.hosts[-1]


@pytest.fixture(scope="module")
def password(lab) -> str:
    return lab.become_password_file.read_text().strip()


@pytest.fixture(scope="module")
def as_user(lab, tmp_path_factory):
    """The sudo inventory with another login: {user: inventory path}."""
    folder = tmp_path_factory.mktemp("sudo-inventories")
    data = yaml.safe_load(lab.sudo_inventory.read_text())
    made = {}
    for user in ("deploy-pw", "nosudo"):
        for entry in data["all"]["children"]["lab"]["hosts"].values():
            entry["ansible_user"] = user
        made[user] = folder / f"{user}.yml"
        made[user].write_text(yaml.safe_dump(data))
    return made


@pytest.fixture(scope="module")
def deployed(lab, host):
    """The host runs GOOD, deployed through the sudo login."""
    done = cli("deploy", "-i", str(lab.sudo_inventory), "--limit", host.name, "--profile", GOOD, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return host


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    done = orchestrator(*args, timeout=timeout)
    print(f"\n{args[0]}: rc {done.returncode} in {time.monotonic() - started:.1f} s")
    return done


def on_a_terminal(args: list[str], typed: str, timeout: float = 120) -> tuple[int, str, float]:
    """The CLI on a pty (as a user at a terminal), `typed` at its BECOME password prompt."""
    started = time.monotonic()
    child = pexpect.spawn(
        sys.executable,
        ["-m", "orchestrator", *args, "-K"],
        encoding="utf-8",
        timeout=timeout,
        dimensions=(50, 250),
        env={**os.environ, "COLUMNS": "250"},  # rich reads a dumb terminal as 80 wide otherwise
    )
    child.expect_exact("BECOME password: ")
    child.sendline(typed)
    child.expect(pexpect.EOF)
    child.close()
    said = nspawn.ANSI_ESCAPE.sub("", child.before or "").replace("\r", "")  # a terminal's output
    elapsed = time.monotonic() - started
    print(f"\n{args[0]} -K: rc {child.exitstatus} in {elapsed:.1f} s")
    return child.exitstatus, said, elapsed


# --- deploy: passwordless sudo -----------------------------------------------------------------


def test_deploy_again_and_check_change_nothing(lab, deployed):
    before = service(deployed)
    inv = ["-i", str(lab.sudo_inventory), "--limit", deployed.name]
    done = cli("deploy", *inv, "--profile", GOOD, "--json")
    assert done.returncode == 0, done.stderr
    (h,) = json.loads(done.stdout)["hosts"]
    assert h["ok"] and not h["changed"] and not h["restarted"]
    done = cli("deploy", *inv, "--profile", "cg_2step", "--check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--speculative-num-steps" in done.stdout  # the flags that would change
    assert service(deployed) == before


def test_status_verify_logs_preflight_and_bench(lab, deployed):
    inv = ["-i", str(lab.sudo_inventory), "--limit", deployed.name]
    done = cli("status", *inv, "--json")
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert row["profile"] == GOOD and row["active_state"] == "active" and row["health"] == 200
    assert row["gpu_used_mib"] > 0
    done = cli("verify", *inv, "--profile", GOOD)
    assert done.returncode == 0 and "FAIL" not in done.stdout, done.stdout + done.stderr
    done = cli("logs", *inv, "--lines", "5")
    lines = [line for line in done.stdout.splitlines() if line.startswith(f"{deployed.name} ")]
    assert done.returncode == 0 and len(lines) == 5, done.stdout + done.stderr
    done = cli("preflight", *inv, "--profile", GOOD)
    assert done.returncode == 0 and f"{deployed.name}: ok" in done.stdout, done.stdout + done.stderr
    done = cli("bench", *inv, *LOAD, "--json")
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)
    assert row["result"] == "ok" and row["tok_s"] > 0


def test_stop_then_rollback_brings_the_server_back(lab, deployed):
    inv = ["-i", str(lab.sudo_inventory), "--limit", deployed.name]
    done = cli("stop", *inv)
    assert done.returncode == 0 and "GPUs released" in done.stdout, done.stdout + done.stderr
    assert service(deployed)["ActiveState"] in ("inactive", "failed")
    done = cli("rollback", *inv, "--to", GOOD, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert service(deployed)["ActiveState"] == "active"


# --- a password: -K -------------------------------------------------------------------------


class PsWatch:
    """`ps` on the control machine and on the host, sampled until stopped: every argv seen."""

    def __init__(self, host) -> None:
        self.host, self.seen, self.samples = host, set(), 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.is_set():
            local = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout
            remote = subprocess.run(
                nspawn.ssh_argv(self.host.address, "ps -eww -o args"), capture_output=True, text=True
            ).stdout
            self.seen.update(local.splitlines() + remote.splitlines())
            self.samples += 1

    def __enter__(self) -> PsWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()


def test_k_with_the_right_password_deploys_and_the_password_is_kept_nowhere(lab, deployed, as_user, password):
    before = service(deployed)["MainPID"]
    args = ["deploy", "-i", str(as_user["deploy-pw"]), "--limit", deployed.name, "--profile", GOOD]
    with PsWatch(deployed) as ps:
        rc, said, _ = on_a_terminal([*args, "--force-restart"], password)
    assert rc == 0, said
    assert service(deployed)["MainPID"] != before  # really restarted, as root, through sudo
    print(f"ps sampled {ps.samples} times, {len(ps.seen)} distinct command lines")
    assert ps.samples > 3 and not [line for line in ps.seen if password in line]
    assert password not in said
    leaks = [
        path
        for path in state_dir().rglob("*")
        if path.is_file()
        and path != lab.become_password_file
        and nspawn.lab_dir() / "hosts" not in path.parents  # the hosts' roots: their journal is next
        and password.encode() in path.read_bytes()
    ]
    assert leaks == []
    journal = ssh(deployed, "journalctl --no-pager -o json --since '-10 min'")
    assert journal.strip() and password not in journal


def _refused(lab, host, inventory: Path, typed: str | None) -> str:
    """A deploy that sudo refuses: fails on the probe (nothing stopped), one line for the host."""
    before = service(host)["MainPID"]
    args = ["deploy", "-i", str(inventory), "--limit", host.name, "--profile", GOOD, "--force-restart"]
    if typed is None:
        done = cli(*args)
        rc, said = done.returncode, done.stdout + done.stderr
    else:
        rc, said, _ = on_a_terminal(args, typed)
    assert rc == 1, said
    assert service(host)["MainPID"] == before  # the running server was not touched
    (line,) = [x.strip() for x in said.splitlines() if x.strip().startswith(f"{host.name}: ")]
    return line


def test_a_wrong_password_is_told_in_one_line(lab, deployed, as_user):
    line = _refused(lab, deployed, as_user["deploy-pw"], "not-the-password")
    assert line.endswith("sudo refused the become password for deploy-pw: give -K that user's own password")


def test_a_missing_k_is_told_in_one_line(lab, deployed, as_user):
    line = _refused(lab, deployed, as_user["deploy-pw"], None)
    assert line.endswith("sudo as deploy-pw asks for a password: pass -K/--ask-become-pass")


def test_a_user_without_sudo_is_told_in_one_line(lab, deployed, as_user, password):
    line = _refused(lab, deployed, as_user["nosudo"], password)
    assert "nosudo may not sudo on this host (not in sudoers)" in line


def test_status_names_the_fix_too(lab, deployed, as_user):
    done = cli("status", "-i", str(as_user["deploy-pw"]), "--limit", deployed.name)
    assert done.returncode == 1
    assert f"{deployed.name}: sudo as deploy-pw asks for a password: pass -K/--ask-become-pass" in done.stderr
