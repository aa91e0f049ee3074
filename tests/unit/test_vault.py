"""Ansible Vault, as a team keeps its secrets: a whole-file vaulted group_vars and inline `!vault` values,
made by the real `ansible-vault`, read by orchestrator's own inventory reading and by ansible-playbook,
with the password from ANSIBLE_VAULT_PASSWORD_FILE, ansible.cfg, --vault-password-file, --vault-id or
--ask-vault-pass. A wrong or missing password is one line naming the file, never a traceback; a typed
password reaches ansible-playbook only as the answer to its prompt.

The lab shows it against real sudo and a real API key (tests/lab/test_team_setup.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from orchestrator.cli.main import VAULT_COMMANDS, cli
from orchestrator.errors import InputError
from orchestrator.hosts import ansible_config, inventory, runner, secrets, vault
from orchestrator.hosts.playvars import PlayVars
from orchestrator.paths import ROOT
from orchestrator.profile import model as profile_mod

PASSWORD = "vault-Pass-9d1"
OTHER = "another-vault-pass"
BECOME = "s3cret-become-0c4"
#: The shipped example profiles (the checkout's, or the installed package's).
EXAMPLES = ROOT / "profiles"
WRONG_LINE = "group_vars/gpu/vault.yml: the vault password does not decrypt it (Decryption failed)"


@pytest.fixture(autouse=True)
def clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for name in [n for n in os.environ if n.startswith("ANSIBLE_")]:
        monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(ansible_config, "_memo", {})
    monkeypatch.setattr(runner, "_become_password", "")
    vault.reset()
    yield
    vault.reset()


def ansible_vault(*args: str, password_file: Path, text: str | None = None) -> str:
    done = subprocess.run(
        [runner.ansible_command("ansible-vault"), *args, "--vault-password-file", str(password_file)],
        input=text,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def password_file(folder: Path, name: str, password: str) -> Path:
    path = folder / name
    path.write_text(password + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def team(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A team's repository, the current directory: hosts.yml (two local hosts in group gpu), a whole-file
    vaulted group_vars/gpu/vault.yml (the become password, the hosts' address) and an inline `!vault`
    value in group_vars/gpu/main.yml (the deployment kind); the password in ../pw."""
    repo = tmp_path / "repo"
    (repo / "group_vars" / "gpu").mkdir(parents=True)
    pw = password_file(tmp_path, "pw", PASSWORD)
    password_file(tmp_path, "wrong", "not-the-password")
    (repo / "hosts.yml").write_text(
        "all:\n  children:\n    gpu:\n      hosts:\n        h1: {}\n        h2: {}\n"
        "      vars:\n        ansible_connection: local\n"
        "        ansible_python_interpreter: '{{ ansible_playbook_python }}'\n"
    )
    secret = repo / "group_vars" / "gpu" / "vault.yml"
    secret.write_text(f"ansible_become_password: {BECOME}\nansible_host: 10.9.9.9\n")
    ansible_vault("encrypt", str(secret), password_file=pw)
    inline = ansible_vault(
        "encrypt_string", "--stdin-name", "orchestrator_deployment", password_file=pw, text="fleet"
    )
    (repo / "group_vars" / "gpu" / "main.yml").write_text(f"vault_kept_here: true\n{inline}")
    monkeypatch.chdir(repo)
    return repo


def test_the_files_are_really_vaulted(team: Path) -> None:
    assert (team / "group_vars/gpu/vault.yml").read_bytes().startswith(vault.HEADER)
    assert BECOME.encode() not in (team / "group_vars/gpu/vault.yml").read_bytes()
    assert "!vault |" in (team / "group_vars/gpu/main.yml").read_text()


# --- orchestrator's own reading of the inventory -----------------------------------------------


def test_without_a_password_the_vaulted_file_is_named(team: Path) -> None:
    with pytest.raises(InputError) as caught:
        inventory.hosts(team / "hosts.yml")
    assert str(caught.value).startswith("group_vars/gpu/vault.yml: vaulted, and no vault password was given:")
    assert "--ask-vault-pass" in str(caught.value) and "ANSIBLE_VAULT_PASSWORD_FILE" in str(caught.value)


def test_ansible_vault_password_file_decrypts_whole_files_and_inline_values(
    tmp_path: Path, team: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(tmp_path / "pw"))
    found = inventory.hosts(team / "hosts.yml")
    assert found == [
        inventory.InventoryHost("h1", "10.9.9.9", "fleet"),  # the address from the vaulted file,
        inventory.InventoryHost("h2", "10.9.9.9", "fleet"),  # the kind from the !vault value
    ]


def test_vault_password_file_of_ansible_cfg(tmp_path: Path, team: Path) -> None:
    (team / "ansible.cfg").write_text("[defaults]\nvault_password_file = ../pw\n")  # relative to the cfg
    assert [h.address for h in inventory.hosts(team / "hosts.yml")] == ["10.9.9.9", "10.9.9.9"]


def test_vault_password_file_and_vault_id_options(tmp_path: Path, team: Path) -> None:
    vault.use_password_file(str(tmp_path / "pw"))
    assert inventory.hosts(team / "hosts.yml")[0].deployment == "fleet"
    vault.reset()
    vault.use_vault_id(f"team@{tmp_path / 'wrong'}")
    vault.use_vault_id(f"team@{tmp_path / 'pw'}")  # the second id is tried too, as Ansible does
    assert inventory.hosts(team / "hosts.yml")[0].deployment == "fleet"
    vault.reset()
    vault.use_vault_id("team@prompt", PASSWORD)
    assert inventory.hosts(team / "hosts.yml")[0].deployment == "fleet"


def test_a_wrong_password_is_one_line_naming_the_file_every_time(tmp_path: Path, team: Path) -> None:
    vault.use_password_file(str(tmp_path / "pw"))
    inventory.hosts(team / "hosts.yml")  # a good read first: vaulted inventories are never cached
    vault.reset()
    vault.use_password_file(str(tmp_path / "wrong"))
    with pytest.raises(InputError) as caught:
        inventory.hosts(team / "hosts.yml")
    assert str(caught.value) == WRONG_LINE


def test_an_inline_value_that_does_not_decrypt_names_its_file_line_and_variable(
    tmp_path: Path, team: Path
) -> None:
    other = password_file(tmp_path, "other", OTHER)
    inline = ansible_vault("encrypt_string", "--stdin-name", "api_token", password_file=other, text="t0ken")
    (team / "group_vars" / "gpu" / "tokens.yml").write_text(f"# tokens\n{inline}")
    vault.use_password_file(str(tmp_path / "pw"))  # opens vault.yml and main.yml, not tokens.yml
    with pytest.raises(InputError) as caught:
        inventory.hosts(team / "hosts.yml")
    assert str(caught.value) == (
        "group_vars/gpu/tokens.yml:2: the vault password does not decrypt the !vault value of api_token "
        "(Decryption failed)"
    )


def test_a_vaulted_inventory_file_itself(tmp_path: Path, team: Path) -> None:
    ansible_vault("encrypt", str(team / "hosts.yml"), password_file=tmp_path / "pw")
    vault.use_password_file(str(tmp_path / "wrong"))
    with pytest.raises(InputError, match=r"^hosts\.yml: the vault password does not decrypt it"):
        inventory.hosts(team / "hosts.yml")
    vault.reset()
    vault.use_password_file(str(tmp_path / "pw"))
    assert inventory.host_names(team / "hosts.yml") == ["h1", "h2"]


def test_a_missing_password_file_is_one_line(tmp_path: Path, team: Path) -> None:
    vault.use_password_file(str(tmp_path / "nope"))
    with pytest.raises(InputError, match=r"^vault password file .*nope: "):
        inventory.hosts(team / "hosts.yml")


def test_the_login_user_for_a_become_diagnosis_reads_the_vault(tmp_path: Path, team: Path) -> None:
    user = ansible_vault(
        "encrypt_string", "--stdin-name", "ansible_user", password_file=tmp_path / "pw", text="ops"
    )
    (team / "group_vars" / "gpu" / "login.yml").write_text(user)
    vault.use_password_file(str(tmp_path / "pw"))
    assert runner._login_users(team / "hosts.yml") == {"h1": "ops", "h2": "ops"}


def test_verify_gives_testinfra_the_decrypted_connection_variables(tmp_path: Path, team: Path) -> None:
    pytest.importorskip("testinfra")
    from testinfra.utils.ansible_runner import AnsibleRunner

    from orchestrator.hosts.verify import run as verify_run

    vault.use_password_file(str(tmp_path / "pw"))
    verify_run._give_testinfra(team / "hosts.yml", ["h1"])
    seen = AnsibleRunner.get_runner(str(team / "hosts.yml")).inventory
    assert seen["_meta"]["hostvars"]["h1"]["ansible_host"] == "10.9.9.9"


# --- a vaulted API key file ---------------------------------------------------------------------


def test_a_vaulted_api_key_file_is_decrypted_and_may_be_readable_by_others(
    tmp_path: Path, team: Path
) -> None:
    key = team / "api.key"
    key.write_text("s3cr3t-key\n")
    ansible_vault("encrypt", str(key), password_file=tmp_path / "pw")
    key.chmod(0o644)  # encrypted at rest, as in the team's repository
    prof = tmp_path / "keyed.yml"
    data, _ = profile_mod.load_raw(str(EXAMPLES / "cg_5tok.yml"))
    data.pop("extends", None)
    prof.write_text(yaml.safe_dump({**data, "api_key": {"file": str(key)}}))
    with pytest.raises(InputError, match=r"vaulted, and no vault password was given"):
        secrets.api_key(profile_mod.load(str(prof)))
    vault.use_password_file(str(tmp_path / "wrong"))
    with pytest.raises(InputError) as caught:
        secrets.api_key(profile_mod.load(str(prof)))
    assert str(caught.value) == (
        f"api_key.file: {key}: the vault password does not decrypt it (Decryption failed)"
    )
    vault.reset()
    vault.use_password_file(str(tmp_path / "pw"))
    assert secrets.api_key(profile_mod.load(str(prof))) == "s3cr3t-key"


# --- ansible-playbook ------------------------------------------------------------------------------


@pytest.fixture
def books(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "playbooks"
    folder.mkdir()
    (folder / "secret.yml").write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.debug:\n"
        "        msg: \"{{ ansible_become_password | hash('sha256') }} {{ orchestrator_deployment }}\"\n"
    )
    monkeypatch.setattr(runner, "PLAYBOOKS_DIR", folder)
    return folder


def _decrypted_in_play(play: runner.PlayResult) -> str:
    import hashlib

    result = play.hosts["h1"].result_of("ansible.builtin.debug")
    assert result is not None, play.status
    return result["msg"].replace(hashlib.sha256(BECOME.encode()).hexdigest(), "<become password>")


def _kept_nowhere(state: Path, secret: str) -> None:
    for path in state.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert not list(state.rglob("passwords"))  # ansible-runner's env/passwords


def test_a_typed_password_answers_ansible_playbooks_prompt_and_is_kept_nowhere(
    tmp_path: Path, team: Path, books: Path
) -> None:
    vault.use_typed_password(PASSWORD)
    play = runner.run_playbook("secret.yml", team / "hosts.yml", PlayVars(), limit="h1")
    assert _decrypted_in_play(play) == "<become password> fleet"
    argv = json.loads(next(play.artifacts.parent.glob("*/command")).read_text())["command"]
    assert "--ask-vault-pass" in argv and PASSWORD not in " ".join(argv)
    _kept_nowhere(tmp_path / "state", PASSWORD)


def test_a_prompt_vault_id_and_a_password_file_reach_ansible_playbook(
    tmp_path: Path, team: Path, books: Path
) -> None:
    vault.use_vault_id("team@prompt", PASSWORD)
    play = runner.run_playbook("secret.yml", team / "hosts.yml", PlayVars(), limit="h1")
    assert _decrypted_in_play(play) == "<become password> fleet"
    _kept_nowhere(tmp_path / "state", PASSWORD)
    vault.reset()
    os.chdir(tmp_path)  # a relative --vault-password-file is the user's, wherever the play runs
    vault.use_password_file("pw")
    os.chdir(team)
    play = runner.run_playbook("secret.yml", team / "hosts.yml", PlayVars(), limit="h1")
    assert _decrypted_in_play(play) == "<become password> fleet"
    argv = json.loads(next(play.artifacts.parent.glob("*/command")).read_text())["command"]
    assert str(tmp_path / "pw") in argv


def test_ansible_playbook_reads_the_vault_password_file_of_ansible_cfg(
    tmp_path: Path, team: Path, books: Path
) -> None:
    (team / "ansible.cfg").write_text("[defaults]\nvault_password_file = ../pw\n")
    play = runner.run_playbook("secret.yml", team / "hosts.yml", PlayVars(), limit="h1")
    assert _decrypted_in_play(play) == "<become password> fleet"


# --- the command line ----------------------------------------------------------------------------


def _help(name: str) -> str:
    import click

    command = cli.get_command(click.Context(cli), name)
    assert command is not None
    return command.get_help(click.Context(command, info_name=name))


@pytest.mark.parametrize("name", sorted(VAULT_COMMANDS))
def test_every_command_that_reads_the_inventory_takes_the_vault_options(name: str) -> None:
    text = _help(name)
    assert "--vault-id" in text and "--vault-password-file" in text and "-J, --ask-vault-pass" in text


@pytest.mark.parametrize("name", ["render", "validate", "profiles", "history", "results", "schema"])
def test_commands_that_read_no_inventory_do_not(name: str) -> None:
    assert "--vault-id" not in _help(name)


def test_a_wrong_password_on_the_command_line_is_one_line_and_exit_2(tmp_path: Path, team: Path) -> None:
    done = CliRunner().invoke(
        cli, ["status", "-i", "hosts.yml", "--vault-password-file", str(tmp_path / "wrong")]
    )
    assert done.exit_code == 2
    assert done.stderr == f"error: {WRONG_LINE}\n"
    assert "Traceback" not in done.output


def test_ask_vault_pass_asks_once_and_every_read_and_play_gets_it(
    team: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.hosts import status_play

    asked, seen = [], []
    monkeypatch.setattr("getpass.getpass", lambda prompt: asked.append(prompt) or PASSWORD)

    def fake_status(inv: Path, **kwargs):
        seen.append([h.address for h in inventory.hosts(inv)])
        seen.append(vault.play_options()[0])
        return []

    monkeypatch.setattr(status_play, "status", fake_status)
    done = CliRunner().invoke(cli, ["status", "-J", "-i", "hosts.yml"])
    assert done.exit_code == 0, done.output
    assert asked == ["Vault password: "]
    assert seen == [["10.9.9.9", "10.9.9.9"], ["--ask-vault-pass"]]
    assert PASSWORD not in done.output


def test_ask_vault_pass_of_ansible_cfg_and_its_prompt_ids_are_asked_too(
    team: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.hosts import status_play

    (team / "ansible.cfg").write_text("[defaults]\nask_vault_pass = True\nvault_identity_list = ops@prompt\n")
    asked = []
    monkeypatch.setattr("getpass.getpass", lambda prompt: asked.append(prompt) or PASSWORD)
    monkeypatch.setattr(status_play, "status", lambda *a, **k: [])
    done = CliRunner().invoke(cli, ["status", "-i", "hosts.yml"])
    assert done.exit_code == 0, done.output
    assert asked == ["Vault password: ", "Vault password (ops): "]
    assert set(vault.play_options()[1].values()) == {PASSWORD}


def test_an_empty_vault_password_is_refused(team: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("getpass.getpass", lambda prompt: "")
    done = CliRunner().invoke(cli, ["stop", "--vault-id", "ops@prompt", "-i", "hosts.yml"])
    assert done.exit_code == 2 and "the vault password is empty" in done.output
