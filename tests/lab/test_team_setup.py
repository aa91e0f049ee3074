"""A team's own Ansible set-up, as it adopts orchestrator: hosts behind a bastion, an ansible.cfg naming
the inventory and a ProxyJump in its ssh_args, a vaulted group_vars holding the become password, and the
API key in a vaulted file. `deploy`, `status`, `verify` and `logs` work through it from the team's
directory, and a wrong vault password is one line naming the file.

The lab's first host is the jump host; the last one refuses SSH from the control machine in its own
network namespace (`nspawn.bastion`), so only the ProxyJump reaches it. It logs in as `deploy-pw`,
whose sudo asks the lab's become password: only the vault holds it (no -K). verify runs as `deploy`
(testinfra cannot answer sudo's prompt) from a second inventory beside the first, with the same
vaulted group_vars. One deploy; the vault password comes in every way Ansible takes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pexpect
import pytest
import yaml

import orchestrator
from labutil import ssh
from orchestrator.hosts.runner import ansible_command
from orchestrator.lab import nspawn
from orchestrator.paths import ROOT, state_dir
from orchestrator.profile import model as profile_mod

pytestmark = pytest.mark.lab

VAULT_PASSWORD = "team-vault-Pass-31f"
API_KEY = "sk-team-" + os.urandom(8).hex()
WRONG = "group_vars/gpu/vault.yml: the vault password does not decrypt it (Decryption failed)"


@dataclass(frozen=True)
class Team:
    repo: Path
    jump: nspawn.LabHost
    host: nspawn.LabHost
    profile: Path
    vault_pass: Path
    wrong_pass: Path
    become_password: str


def _private(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def _encrypt(path: Path, password_file: Path) -> None:
    argv = [
        ansible_command("ansible-vault"),
        "encrypt",
        str(path),
        "--vault-password-file",
        str(password_file),
    ]
    subprocess.run(argv, check=True, capture_output=True)


def _inventory(lab, host, user: str) -> str:
    """The lab's own connection settings for `host`, logging in as `user`, in group gpu."""
    entry = yaml.safe_load(lab.sudo_inventory.read_text())["all"]["children"]["lab"]["hosts"][host.name]
    entry = {k: v for k, v in entry.items() if not k.startswith("lab_")}
    entry["ansible_user"] = user
    return yaml.safe_dump({"all": {"children": {"gpu": {"hosts": {host.name: entry}}}}}, sort_keys=False)


@pytest.fixture(scope="module")
def team(lab, tmp_path_factory):
    """The team's repository, behind a bastion for as long as this module runs."""
    if len(lab.hosts) < 2:
        pytest.skip("a bastion needs two lab hosts")
    jump, host = lab.hosts[0], lab.hosts[-1]
    base = tmp_path_factory.mktemp("team")
    repo, keep = base / "repo", base / "secrets"
    (repo / "group_vars" / "gpu").mkdir(parents=True)
    keep.mkdir(mode=0o700)
    vault_pass = _private(keep / "vault-pass", VAULT_PASSWORD + "\n")
    wrong_pass = _private(keep / "wrong-pass", "not-the-team-password\n")
    become_password = lab.become_password_file.read_text().strip()
    # The jump host's own connection settings, in the ssh config ssh_args names (ProxyJump's ssh reads
    # it too, and takes none of the command line's -o options).
    (repo / "ssh_config").write_text(
        f"Host {jump.address}\n  User root\n  IdentityFile {lab.private_key}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {lab.known_hosts}\n  StrictHostKeyChecking yes\n  BatchMode yes\n"
    )
    (repo / "ansible.cfg").write_text(
        "[defaults]\ninventory = hosts.yml\n\n"
        f"[ssh_connection]\nssh_args = -F ssh_config -o ProxyJump=root@{jump.address}\n"
        # The team's own multiplexing sockets: a master this machine opened to the same host
        # directly before the bastion went up (another test, ControlPersist) is dead now, and
        # reusing it would hang at sudo's prompt.
        f"control_path_dir = {repo / 'cp'}\n"
    )
    (repo / "hosts.yml").write_text(_inventory(lab, host, nspawn.PASSWORD_SUDO_USER))
    (repo / "hosts-verify.yml").write_text(_inventory(lab, host, nspawn.SUDO_USER))
    secret = repo / "group_vars" / "gpu" / "vault.yml"
    secret.write_text(yaml.safe_dump({"ansible_become_password": become_password}))
    _encrypt(secret, vault_pass)
    key = repo / "api.key"
    key.write_text(API_KEY + "\n")
    _encrypt(key, vault_pass)
    key.chmod(0o644)  # encrypted at rest, as in a repository
    data, _ = profile_mod.load_raw(str(ROOT / "profiles" / "cg_5tok.yml"))
    data.pop("extends", None)
    prof = repo / "team.yml"
    prof.write_text(yaml.safe_dump({**data, "api_key": {"file": str(key)}}))
    nspawn.bastion(jump.name)
    try:
        yield Team(repo, jump, host, prof, vault_pass, wrong_pass, become_password)
    finally:
        nspawn.lift_bastion()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "orchestrator",
                "stop",
                "-i",
                str(lab.sudo_inventory),
                "--limit",
                host.name,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        ssh(host, "rm -f /etc/orchestrator/sglang.config.yaml")  # leave no API key of ours behind


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(orchestrator.__file__).parent.parent), env.get("PYTHONPATH", "")]
    )
    return {**env, **extra}


def cli(team: Team, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    """The CLI as the team runs it: from its repository, no -i (ansible.cfg names the inventory)."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=team.repo,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    print(f"\n{args[0]}: rc {done.returncode} in {time.monotonic() - started:.1f} s")
    return done


@pytest.fixture(scope="module")
def deployed(team):
    done = cli(
        team,
        "deploy",
        "--profile",
        str(team.profile),
        "--json",
        "--vault-password-file",
        str(team.vault_pass),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_the_hosts_refuse_ssh_from_here_but_not_through_the_jump_host(team):
    direct = subprocess.run(
        nspawn.ssh_argv(team.host.address, "true", connect_timeout=3), capture_output=True, text=True
    )
    assert direct.returncode == 255 and "timed out" in direct.stderr, direct.stderr
    through = nspawn.ssh_argv(team.host.address, "true", connect_timeout=10)
    through[1:1] = ["-F", str(team.repo / "ssh_config"), "-J", f"root@{team.jump.address}"]
    done = subprocess.run(through, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert subprocess.run(nspawn.ssh_argv(team.jump.address, "true"), capture_output=True).returncode == 0


def test_deploy_through_the_bastion_with_the_vaulted_become_password_and_key(team, deployed):
    first = deployed.stderr.splitlines()[0]
    assert first == f"inventory: {team.repo / 'hosts.yml'} (from ansible.cfg: {team.repo / 'ansible.cfg'})"
    (h,) = json.loads(deployed.stdout)["hosts"]  # --json stdout is JSON alone
    assert h["host"] == team.host.name and h["ok"], h
    # The key reached the server: it refuses a request without it (asked from the jump host).
    url = f"http://{team.host.address}:30000/v1/models"
    asked = "curl -s -o /dev/null -w '%{http_code}' "
    assert ssh(team.jump, asked + url) == "401"
    assert ssh(team.jump, asked + f"-H 'Authorization: Bearer {API_KEY}' " + url) == "200"
    # The vault password, the key and the become password stay out of every file orchestrator keeps
    # (not the hosts' own file systems, which hold the key by design, nor the lab's password file).
    skipped = (state_dir() / "lab/hosts", state_dir() / "lab-cache", nspawn.become_password_file())
    for folder, subdirs, files in os.walk(state_dir()):
        subdirs[:] = [d for d in subdirs if Path(folder, d) not in skipped]
        for path in (Path(folder, name) for name in files if Path(folder, name) not in skipped):
            data = path.read_bytes() if path.is_file() else b""
            for secret in (VAULT_PASSWORD, API_KEY, team.become_password):
                assert secret.encode() not in data, path


def test_status_with_ansible_vault_password_file(team, deployed):
    done = cli(team, "status", "--json", ANSIBLE_VAULT_PASSWORD_FILE=str(team.vault_pass))
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert row["host"] == team.host.name and row["active_state"] == "active" and row["health"] == 200


def test_logs_with_a_vault_id(team, deployed):
    done = cli(team, "logs", "--lines", "5", "--vault-id", f"team@{team.vault_pass}")
    lines = [line for line in done.stdout.splitlines() if line.startswith(f"{team.host.name} ")]
    assert done.returncode == 0 and len(lines) == 5, done.stdout + done.stderr


def test_verify_with_the_vault_password_typed_at_its_prompt(team, deployed):
    """-J on a terminal: asked once, answering the inventory read (the vaulted group_vars beside
    hosts-verify.yml); testinfra reaches the host through ansible.cfg's ProxyJump."""
    child = pexpect.spawn(
        sys.executable,
        ["-m", "orchestrator", "verify", "-i", "hosts-verify.yml", "--profile", str(team.profile), "-J"],
        cwd=str(team.repo),
        env={**_env(), "COLUMNS": "250"},
        encoding="utf-8",
        timeout=300,
        dimensions=(50, 250),
    )
    child.expect_exact("Vault password: ")
    child.sendline(VAULT_PASSWORD)
    child.expect(pexpect.EOF)
    child.close()
    said = nspawn.ANSI_ESCAPE.sub("", child.before or "")
    assert child.exitstatus == 0 and "FAIL" not in said and "pass" in said, said


def test_a_wrong_vault_password_is_one_line_naming_the_file(team):
    done = cli(team, "status", "--vault-password-file", str(team.wrong_pass))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines()[-1] == f"error: {WRONG}", done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 2  # the inventory line, this
    done = cli(team, "deploy", "--profile", str(team.profile))
    assert done.returncode == 2 and "group_vars/gpu/vault.yml: vaulted, and no vault password" in done.stderr
