"""The lab behaves like a set of real hosts: SSH, systemd, a network between them, Ansible."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import ansible_runner
import pytest
import yaml
from click.testing import CliRunner

from orchestrator.cli.lab_command import lab as lab_cli
from orchestrator.errors import InputError
from orchestrator.lab import nspawn

pytestmark = pytest.mark.lab


def ssh(address: str, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(nspawn.ssh_argv(address, *command), capture_output=True, text=True, timeout=30)


def test_ssh_reaches_each_host_by_name(lab):
    for host in lab.hosts:
        done = ssh(host.address, "hostname")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == host.name


def test_systemd_is_running_on_each_host(lab):
    # "degraded" only means some unit failed: other tests leave failed sglang.service units behind
    # on purpose. The host's own units must all be fine.
    for host in lab.hosts:
        state = ssh(host.address, "systemctl", "is-system-running").stdout.strip()
        assert state in ("running", "degraded"), (host.name, state)
        failed = ssh(host.address, "systemctl", "--failed", "--no-legend", "--plain").stdout.split()
        # The units the lab stands on (systemd-update-utmp was once seen failed after a busy run; it
        # records boot/runlevel in utmp and nothing here depends on it).
        needed = ("ssh.service", "dbus.service", "systemd-journald.service", "systemd-logind.service")
        assert not [u for u in failed if u in needed], (host.name, failed)


def test_hosts_reach_each_other_and_nothing_else(lab):
    if len(lab.hosts) < 2:
        pytest.skip("needs two hosts")
    first, second = lab.hosts[0], lab.hosts[1]
    connect = f"import socket; socket.create_connection(('{second.name}', 22), timeout=3).close()"
    done = ssh(first.address, "python3", "-c", f'"{connect}"')
    assert done.returncode == 0, done.stderr
    assert ssh(first.address, "ping", "-c1", "-W2", second.address).returncode == 0
    # No default route: a lab host can only talk to the lab and the control machine.
    assert "default" not in ssh(first.address, "ip", "route").stdout


def test_ansible_ping_succeeds_on_every_host(lab, tmp_path):
    """Real Ansible over real SSH, through ansible-runner as the deploy itself runs it."""
    result = ansible_runner.run(
        private_data_dir=str(tmp_path),
        inventory=str(lab.inventory),
        host_pattern="all",
        module="ansible.builtin.ping",
        quiet=True,
        timeout=120,
    )
    assert result.rc == 0, result.stdout.read()
    assert sorted(result.stats["ok"]) == sorted(h.name for h in lab.hosts)
    assert not result.stats["failures"] and not result.stats["dark"]


def test_inventory_names_every_host_with_its_connection(lab):
    inventory = yaml.safe_load(lab.inventory.read_text())
    hosts = inventory["all"]["children"]["lab"]["hosts"]
    assert list(hosts) == [h.name for h in lab.hosts]
    for host in lab.hosts:
        entry = hosts[host.name]
        assert entry["ansible_host"] == host.address
        assert entry["ansible_user"] == "root"
        assert entry["ansible_python_interpreter"] == "/usr/bin/python3"
        assert entry["lab_gpus"] == lab.gpus and entry["lab_sglang_version"] == lab.sglang_version


def _as(host, user: str, line: str, key: Path | None = None) -> subprocess.CompletedProcess[str]:
    argv = nspawn.ssh_argv(host.address, line, user=user, key=key)
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def test_deploy_logs_in_with_the_user_key_and_sudoes_without_a_password(lab):
    for host in lab.hosts:
        done = _as(host, "deploy", "id -un && sudo -n id -un")
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["deploy", "root"]


def test_each_key_opens_only_its_own_logins(lab):
    host = lab.hosts[0]
    assert lab.user_key != lab.private_key
    assert _as(host, "deploy", "true", key=lab.private_key).returncode == 255  # root's key: not deploy's
    assert _as(host, "root", "true", key=lab.user_key).returncode == 255  # the user key: not root's
    assert _as(host, "root", "true").returncode == 0


def test_deploy_pw_sudoes_with_the_labs_become_password_only(lab):
    host = lab.hosts[0]
    assert lab.become_password_file.stat().st_mode & 0o777 == 0o600
    password = lab.become_password_file.read_text().strip()
    assert "a password is required" in _as(host, "deploy-pw", "sudo -n true").stderr
    wrong = _as(host, "deploy-pw", "echo wrong | sudo -S -p '' true")
    assert wrong.returncode == 1 and "incorrect password" in wrong.stderr
    right = _as(host, "deploy-pw", f"echo {password} | sudo -S -p '' id -un")
    assert right.returncode == 0 and right.stdout.strip() == "root", right.stderr


def test_nosudo_may_not_sudo_even_with_its_password(lab):
    password = lab.become_password_file.read_text().strip()
    done = _as(lab.hosts[0], "nosudo", f"echo {password} | sudo -S -p '' true")
    assert done.returncode == 1 and "nosudo is not in the sudoers file" in done.stderr


def test_sglang_is_a_system_user_without_a_login(lab):
    for host in lab.hosts:
        entry = ssh(host.address, "getent", "passwd", "sglang").stdout.strip().split(":")
        assert entry[0] == "sglang" and int(entry[2]) < 1000, entry
        assert entry[5:] == ["/var/lib/sglang", "/usr/sbin/nologin"]


def test_sudo_inventory_logs_in_as_deploy_and_becomes_root(lab, tmp_path):
    inventory = yaml.safe_load(lab.sudo_inventory.read_text())
    hosts = inventory["all"]["children"]["lab"]["hosts"]
    assert list(hosts) == [h.name for h in lab.hosts]
    for entry in hosts.values():
        assert entry["ansible_user"] == "deploy" and entry["ansible_become"] is True
        assert entry["ansible_ssh_private_key_file"] == str(lab.user_key)
    result = ansible_runner.run(
        private_data_dir=str(tmp_path),
        inventory=str(lab.sudo_inventory),
        host_pattern=lab.hosts[0].name,
        module="ansible.builtin.command",
        module_args="id -un",
        quiet=True,
        timeout=120,
    )
    assert result.rc == 0, result.stdout.read()
    said = [e["event_data"]["res"]["stdout"] for e in result.events if e["event"] == "runner_on_ok"]
    assert said == ["root"]


def test_a_lab_of_an_older_format_is_rebuilt_not_reused(lab, monkeypatch):
    """A lab up from before the login users must not pass for one that has them."""
    monkeypatch.setattr(nspawn, "FORMAT", nspawn.FORMAT + 1)
    record = nspawn._Record.load()
    assert record is not None
    assert nspawn._reuse(record, len(lab.hosts), lab.gpus, lab.sglang_version, lab.podman) is None


def test_up_on_a_running_lab_changes_nothing(lab):
    again = nspawn.up(
        hosts=len(lab.hosts), gpus=lab.gpus, sglang_version=lab.sglang_version, podman=lab.podman
    )
    assert again.reused
    assert [h.pid for h in again.hosts] == [h.pid for h in lab.hosts]


def test_up_with_another_host_count_asks_for_down_first(lab):
    with pytest.raises(InputError, match="lab down"):
        nspawn.up(
            hosts=len(lab.hosts) + 1, gpus=lab.gpus, sglang_version=lab.sglang_version, podman=lab.podman
        )


def test_status_command_shows_every_host_healthy(lab):
    result = CliRunner().invoke(lab_cli, ["status"])
    assert result.exit_code == 0, result.output
    for host in lab.hosts:
        assert host.name in result.output and host.address in result.output
    assert f"as sudoer: {lab.sudo_inventory}" in result.output


def _leftovers(record: dict) -> list[str]:
    """Everything a recorded lab made that still exists: processes, namespaces, links, mounts, dirs."""
    mounts = Path("/proc/mounts").read_text()
    links = os.listdir("/sys/class/net")
    found = []
    if record.get("bridge") in links:
        found.append(record["bridge"])
    for name, entry in record["hosts"].items():
        for key in ("pid", "leader"):
            if nspawn._alive(entry.get(key), entry.get(key + "_start")):
                found.append(f"{name} {key} {entry[key]}")
        if entry["veth"] in links:
            found.append(entry["veth"])
        if os.path.exists(f"/run/netns/{entry['netns']}"):
            found.append(f"netns {entry['netns']}")
        if entry["dir"] in mounts:
            found.append(f"mount under {entry['dir']}")
        if os.path.exists(entry["dir"]):
            found.append(entry["dir"])
    return found


def _record() -> dict:
    return json.loads(nspawn._Record.path().read_text())


@pytest.mark.lab_destructive
def test_up_after_a_crash_cleans_up_and_rebuilds(lab):
    before = _record()
    victim = before["hosts"][lab.hosts[-1].name]
    os.kill(victim["pid"], signal.SIGKILL)  # nspawn dies; its container would be orphaned
    assert not nspawn.status().healthy
    rebuilt = nspawn.up(
        hosts=len(lab.hosts), gpus=lab.gpus, sglang_version=lab.sglang_version, podman=lab.podman
    )
    assert not rebuilt.reused
    for key in ("pid", "leader"):  # the orphaned container went with the old nspawn
        assert not nspawn._alive(victim[key], victim[key + "_start"])
    assert nspawn.status().healthy


@pytest.mark.lab_destructive
def test_down_leaves_nothing_behind_and_up_restores(lab):
    before = _record()
    assert nspawn.down() is True
    assert _leftovers(before) == []
    assert not nspawn._Record.path().exists()
    assert not lab.inventory.exists() and not lab.sudo_inventory.exists()
    assert not lab.become_password_file.exists()
    assert nspawn.down() is False  # nothing recorded, nothing to do
    restored = nspawn.up(
        hosts=len(lab.hosts), gpus=lab.gpus, sglang_version=lab.sglang_version, podman=lab.podman
    )
    assert nspawn.status().healthy and restored.inventory == lab.inventory
