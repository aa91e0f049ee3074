"""A team's ansible.cfg, as Ansible reads it: every setting the user made is kept, orchestrator's speed
settings fill only what the user left at Ansible's default, its roles and plugins are added to the
user's search paths, and the default inventory follows Ansible (-i, ANSIBLE_INVENTORY, ansible.cfg).

The merge is checked as data (`play_environment`) and against a real ansible-playbook, asking it
through `lookup('config', ...)` what it runs with.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli.main import cli
from orchestrator.errors import InputError
from orchestrator.hosts import ansible_config, runner
from orchestrator.hosts.ansible_config import Setting, collections_dir
from orchestrator.hosts.playvars import PlayVars

PROXY = "-o ProxyJump=root@bastion.example -o ServerAliveInterval=15"
TEAM_CFG = f"""\
[defaults]
inventory = hosts.yml
forks = 7
strategy = linear
roles_path = ./team-roles
collections_path = ./team-collections
host_key_checking = True

[ssh_connection]
ssh_args = {PROXY}
pipelining = False
"""


@pytest.fixture(autouse=True)
def clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No ANSIBLE_* of the machine running the tests, an empty home, a state directory of our own."""
    for name in [n for n in os.environ if n.startswith("ANSIBLE_")]:
        monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(ansible_config, "_memo", {})


@pytest.fixture
def team(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A team's Ansible repository, the current directory: ansible.cfg, hosts.yml (one local host)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "ansible.cfg").write_text(TEAM_CFG)
    (repo / "hosts.yml").write_text(
        "all:\n  hosts:\n    h1:\n      ansible_connection: local\n"
        "      ansible_python_interpreter: '{{ ansible_playbook_python }}'\n"
    )
    (repo / "team-roles").mkdir()
    (repo / "team-collections").mkdir()
    monkeypatch.chdir(repo)
    return repo


# --- the merge, as data ----------------------------------------------------------------------


def test_without_a_config_orchestrator_sets_its_speed_settings() -> None:
    config = ansible_config.read()
    assert config.file is None
    env = ansible_config.play_environment(config, forks=20)
    assert env["ANSIBLE_SSH_ARGS"] == "-o ControlMaster=auto -o ControlPersist=120s"
    assert env["ANSIBLE_PIPELINING"] == "True"
    assert env["ANSIBLE_STRATEGY"] == "orchestrator.sglang.orchestrator_linear"
    assert env["ANSIBLE_FORKS"] == "20"
    assert "ANSIBLE_CONFIG" not in env
    # orchestrator's collection comes first; Ansible's default collection paths stay searched after it
    found = env["ANSIBLE_COLLECTIONS_PATH"].split(os.pathsep)
    assert found[0] == str(collections_dir()) and any(p.endswith("/.ansible/collections") for p in found[1:])
    assert (collections_dir() / "ansible_collections/orchestrator/sglang/galaxy.yml").is_file()
    assert "ANSIBLE_ROLES_PATH" not in env  # the user's roles path is theirs, untouched


def test_every_setting_the_user_made_is_kept(team: Path) -> None:
    config = ansible_config.read()
    assert config.file == str(team / "ansible.cfg")
    env = ansible_config.play_environment(config, forks=20)
    assert env["ANSIBLE_CONFIG"] == str(team / "ansible.cfg")  # the play reads the same file
    for theirs in ("ANSIBLE_FORKS", "ANSIBLE_STRATEGY", "ANSIBLE_PIPELINING"):
        assert theirs not in env, theirs  # ansible.cfg's own value applies
    # the ProxyJump stays first and whole; only the multiplexing it does not name is added
    assert env["ANSIBLE_SSH_ARGS"] == f"{PROXY} -o ControlMaster=auto -o ControlPersist=120s"
    ours = [str(collections_dir()), str(team / "team-collections")]
    assert env["ANSIBLE_COLLECTIONS_PATH"].split(os.pathsep) == ours
    assert not {"ANSIBLE_ROLES_PATH", "ANSIBLE_MODULE_UTILS", "ANSIBLE_STRATEGY_PLUGINS"} & set(env)
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "True"


def test_environment_variables_are_settings_the_user_made_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANSIBLE_FORKS", "3")
    monkeypatch.setenv("ANSIBLE_SSH_ARGS", "-o ProxyJump=jump -o ControlMaster=no -o ControlPersist=no")
    monkeypatch.setenv("ANSIBLE_COLLECTIONS_PATH", "/srv/collections")
    env = ansible_config.play_environment(ansible_config.read(), forks=20)
    assert "ANSIBLE_FORKS" not in env
    assert "ANSIBLE_SSH_ARGS" not in env  # names both multiplexing options: nothing to add
    assert env["ANSIBLE_COLLECTIONS_PATH"] == os.pathsep.join([str(collections_dir()), "/srv/collections"])


def test_the_config_file_is_found_as_ansible_finds_it(
    tmp_path: Path, team: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ansible_config.read().file == str(team / "ansible.cfg")  # ./ansible.cfg
    elsewhere = tmp_path / "elsewhere.cfg"
    elsewhere.write_text("[defaults]\nforks = 9\n")
    monkeypatch.setenv("ANSIBLE_CONFIG", str(elsewhere))  # $ANSIBLE_CONFIG comes first
    assert ansible_config.read()["DEFAULT_FORKS"] == Setting(9, str(elsewhere))
    monkeypatch.delenv("ANSIBLE_CONFIG")
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    (Path.home() / ".ansible.cfg").write_text("[defaults]\nforks = 4\n")  # then ~/.ansible.cfg
    assert ansible_config.read().file == str(Path.home() / ".ansible.cfg")
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    (open_dir / "ansible.cfg").write_text("[defaults]\nforks = 2\n")
    monkeypatch.chdir(open_dir)  # Ansible ignores ./ansible.cfg in a world-writable directory
    assert ansible_config.read().file == str(Path.home() / ".ansible.cfg")


@pytest.mark.parametrize(
    ("args", "names"),
    [
        ("-o ProxyJump=a -oControlMaster=auto", {"proxyjump", "controlmaster"}),
        ('-C -o "ControlPersist 60s" -F ssh.cfg', {"controlpersist"}),
        ("-o controlpath=/tmp/%C", {"controlpath"}),
        ("", set()),
    ],
)
def test_ssh_option_names(args: str, names: set[str]) -> None:
    assert ansible_config.ssh_option_names(args) == names


def test_user_ssh_args_get_only_the_multiplexing_they_lack() -> None:
    assert ansible_config.merged_ssh_args(Setting("-o ControlPersist=10m", "/x/ansible.cfg")) == (
        "-o ControlPersist=10m -o ControlMaster=auto"
    )
    both = "-o ProxyJump=j -o ControlMaster=auto -o ControlPersist=5m"
    assert ansible_config.merged_ssh_args(Setting(both, "env: ANSIBLE_SSH_ARGS")) is None


def test_what_was_read_is_cached_until_the_config_changes(
    team: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = ansible_config.read()
    monkeypatch.setattr(ansible_config, "_memo", {})
    monkeypatch.setattr(ansible_config, "_read_with_ansible", lambda: pytest.fail("read again"))
    assert ansible_config.read() == first
    monkeypatch.undo()  # (also restores the working directory: go back)
    monkeypatch.chdir(team)
    (team / "ansible.cfg").write_text(TEAM_CFG.replace("forks = 7", "forks = 8"))
    assert ansible_config.read()["DEFAULT_FORKS"].value == 8


def test_an_unreadable_config_is_one_line(team: Path) -> None:
    from orchestrator.errors import InputError

    (team / "ansible.cfg").write_text("[defaults]\nforks = many\n")
    with pytest.raises(InputError, match=r"Ansible's configuration"):
        ansible_config.read()


# --- the merge, as ansible-playbook sees it ---------------------------------------------------


def test_a_real_play_runs_with_the_users_config_and_ours_added(
    tmp_path: Path, team: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ansible-playbook itself says what it runs with, from the user's directory."""
    books = tmp_path / "playbooks"
    books.mkdir()
    (books / "config.yml").write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.debug:\n        msg:\n"
        "          forks: \"{{ lookup('ansible.builtin.config', 'DEFAULT_FORKS') }}\"\n"
        "          strategy: \"{{ lookup('ansible.builtin.config', 'DEFAULT_STRATEGY') }}\"\n"
        "          roles: \"{{ lookup('ansible.builtin.config', 'DEFAULT_ROLES_PATH') }}\"\n"
        "          collections: \"{{ lookup('ansible.builtin.config', 'COLLECTIONS_PATHS') }}\"\n"
        "          ssh_args: \"{{ lookup('ansible.builtin.config', 'ssh_args', plugin_type='connection',"
        " plugin_name='ssh') }}\"\n"
        "          pipelining: \"{{ lookup('ansible.builtin.config', 'pipelining', plugin_type='connection',"
        " plugin_name='ssh') }}\"\n"
        "          cwd: \"{{ '.' | ansible.builtin.realpath }}\"\n"
    )
    monkeypatch.setattr(runner, "PLAYBOOKS_DIR", books)
    play = runner.run_playbook("config.yml", team / "hosts.yml", PlayVars())
    seen = play.hosts["h1"].result_of("ansible.builtin.debug")
    assert seen is not None, play.status
    msg = seen["msg"]
    # (ansible-core before 2.19 hands lookup results over as text)
    assert str(msg["forks"]) == "7" and msg["strategy"] == "linear" and str(msg["pipelining"]) == "False"
    assert msg["ssh_args"].startswith(PROXY) and "ControlPersist=120s" in msg["ssh_args"]
    assert msg["roles"] == [str(team / "team-roles")]
    assert msg["collections"] == [str(collections_dir()), str(team / "team-collections")]
    # ansible-playbook runs in the user's directory (ssh too): relative paths in their ssh_args (-F)
    # or inventory mean what they mean to their own ansible-playbook
    assert msg["cwd"] == str(team)


# --- the default inventory --------------------------------------------------------------------


def test_the_inventory_of_ansible_cfg_is_the_default(team: Path) -> None:
    source, why = ansible_config.read().inventory_source()
    assert source == team / "hosts.yml"  # relative to ansible.cfg, as Ansible resolves it
    assert why == f"ansible.cfg: {team / 'ansible.cfg'}"


def test_ansible_inventory_beats_ansible_cfg(
    tmp_path: Path, team: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other.yml"
    monkeypatch.setenv("ANSIBLE_INVENTORY", str(other))
    assert ansible_config.read().inventory_source() == (other, "ANSIBLE_INVENTORY")
    monkeypatch.setenv("ANSIBLE_INVENTORY", f"{other},{team / 'hosts.yml'}")
    from orchestrator.errors import InputError

    with pytest.raises(InputError, match=r"names 2 inventories .* pass -i INVENTORY"):
        ansible_config.read().inventory_source()


def test_no_inventory_configured_means_the_lab() -> None:
    assert ansible_config.read().inventory_source() is None


def _status_rows(seen: list[Path]):
    def fake_status(inventory: Path, **kwargs):
        seen.append(inventory)
        return []

    return fake_status


def test_a_command_says_first_which_inventory_and_why(team: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.hosts import status_play

    seen: list[Path] = []
    monkeypatch.setattr(status_play, "status", _status_rows(seen))
    done = CliRunner().invoke(cli, ["status", "--json"])
    assert done.exit_code == 0, done.output
    assert seen == [team / "hosts.yml"]
    assert done.stderr.splitlines()[0] == (
        f"inventory: {team / 'hosts.yml'} (from ansible.cfg: {team / 'ansible.cfg'})"
    )
    assert json.loads(done.stdout) == []  # --json stays pure JSON
    done = CliRunner().invoke(cli, ["status", "--json", "-i", str(team / "hosts.yml")])
    assert done.exit_code == 0 and "inventory:" not in done.stderr  # -i: nothing to explain


def test_a_configured_inventory_that_is_missing_is_bad_input(team: Path) -> None:
    (team / "hosts.yml").unlink()
    done = CliRunner().invoke(cli, ["stop"])
    assert done.exit_code == 2
    assert done.stderr.splitlines()[-1] == (
        f"error: inventory {team / 'hosts.yml'} (ansible.cfg: {team / 'ansible.cfg'}) does not exist"
    )


def test_without_any_inventory_the_lab_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.lab import nspawn

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        nspawn,
        "status",
        lambda: nspawn.LabStatus(exists=False, complete=False, inventory=None, hosts=()),
    )
    done = CliRunner().invoke(cli, ["logs"])
    assert done.exit_code == 2
    first, *_, last = done.stderr.splitlines()
    assert first == (
        f"inventory: the lab's, {nspawn.lab_dir() / 'inventory.yml'} "
        "(no -i, ANSIBLE_INVENTORY or inventory in ansible.cfg)"
    )
    assert last == "error: no inventory given and no lab is up: pass -i INVENTORY"


def _mitogen_release(root: Path, refuse: str = "") -> Path:
    """An unpacked Mitogen release: ansible_mitogen with its strategy folder, whose
    assert_supported_release raises `refuse` (Mitogen's AnsibleError), when given."""
    package = root / "ansible_mitogen"
    (package / "plugins" / "strategy").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    body = f"    raise AnsibleError({refuse!r})\n" if refuse else "    pass\n"
    (package / "loaders.py").write_text(
        f"from ansible.errors import AnsibleError\n\n\ndef assert_supported_release():\n{body}"
    )
    (package / "plugins" / "strategy" / "mitogen_linear.py").write_text("")
    return package / "plugins" / "strategy"


def _asking_for(strategy: str, folder: Path) -> ansible_config.AnsibleConfig:
    return ansible_config.AnsibleConfig(
        "/x/ansible.cfg",
        {
            "DEFAULT_STRATEGY": Setting(strategy, "/x/ansible.cfg"),
            "DEFAULT_STRATEGY_PLUGIN_PATH": Setting([str(folder)], "/x/ansible.cfg"),
        },
    )


@pytest.fixture
def no_mitogen(monkeypatch: pytest.MonkeyPatch) -> None:
    """This Python without an installed Mitogen, whatever the machine has; sys.path restored after."""
    monkeypatch.setattr("sys.path", list(sys.path))
    for name in [m for m in sys.modules if m.split(".")[0] == "ansible_mitogen"]:
        monkeypatch.delitem(sys.modules, name)
    real = ansible_config.importlib.util.find_spec
    monkeypatch.setattr(
        ansible_config.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "ansible_mitogen" else real(name, *a),
    )


def test_mitogen_from_an_unpacked_release_is_found_as_its_strategy_finds_it(tmp_path, no_mitogen) -> None:
    ansible_config.check_mitogen(_asking_for("mitogen_linear", _mitogen_release(tmp_path)))


def test_a_mitogen_that_cannot_run_this_ansible_is_one_line_naming_both(tmp_path, no_mitogen) -> None:
    said = (  # Mitogen 0.3.7's own (ansible_mitogen/loaders.py NEW_VERSION_MSG, ANSIBLE_VERSION_MAX (2, 16))
        "Your Ansible version ((2, 19, 14)) is too recent. The most recent version\n"
        "supported by Mitogen for Ansible is (2, 16).x. Please check the Mitogen\n"
        "release notes to see if a new version is available, otherwise\n"
        "subscribe to the corresponding GitHub issue to be notified when\n"
        "support becomes available.\n\n"
        "    https://mitogen.rtfd.io/en/latest/changelog.html\n"
        "    https://github.com/mitogen-hq/mitogen/issues/\n"
    )
    config = _asking_for("mitogen_linear", _mitogen_release(tmp_path, refuse=said))
    with pytest.raises(InputError) as err:
        ansible_config.check_mitogen(config)
    line = str(err.value)
    assert "\n" not in line and line.startswith(
        "ansible.cfg: /x/ansible.cfg asks for strategy mitogen_linear"
    )
    assert "too recent" in line and "ansible-core 2." in line and "pip install -U mitogen" in line


def test_a_mitogen_strategy_without_mitogen_says_how_to_install_it(tmp_path, no_mitogen, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ansible_mitogen", None)  # not importable, installed or not
    with pytest.raises(InputError, match="Mitogen for Ansible is not installed beside orchestrator"):
        ansible_config.check_mitogen(_asking_for("mitogen_linear", tmp_path))


def test_other_strategies_are_not_mitogens_business(tmp_path, no_mitogen) -> None:
    ansible_config.check_mitogen(_asking_for("free", tmp_path))
