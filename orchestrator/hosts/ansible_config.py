"""The user's Ansible configuration, read as Ansible reads it, and the settings orchestrator's plays run with.

Ansible reads one ini file. It is `$ANSIBLE_CONFIG`, else `./ansible.cfg` (not in a world-writable
directory), else `~/.ansible.cfg`, else `/etc/ansible/ansible.cfg`. `ANSIBLE_*` variables override it.
Ansible's own ConfigManager finds and reads it here. So every setting means what it means to the
user's own `ansible-playbook`.

A play runs in the user's directory, with `ANSIBLE_CONFIG` naming that same file. ansible-runner
would start it elsewhere, where `./ansible.cfg` is not the user's. On top of that, the play gets
environment variables for only these (`play_environment`):

- orchestrator's collection, orchestrator.sglang. It holds the roles, modules, module_utils and
  strategy plugin (see collections_dir below). It goes before the user's collection paths, never in
  their place.
- orchestrator's speed settings and quiet settings, where the user left Ansible's default. The speed
  settings are pipelining, SSH ControlMaster/ControlPersist, forks, and the strategy
  `orchestrator.sglang.orchestrator_linear`. A user's `ssh_args` is kept whole, so a ProxyJump in it
  stays. It gets only the multiplexing options it does not name.
- what orchestrator needs to drive the play. No password prompt comes that the CLI did not ask for
  itself: the CLI answers -K and the vault prompts. The user's `host_key_checking` is passed on,
  because ansible-runner would switch it off. So are the user's callback plugin folders, because
  ansible-runner adds its own to them.

Reading costs about 0.3 s of Ansible imports. So what was found is kept in the state directory, under
a fingerprint of the candidate config files, the `ANSIBLE_*` variables, the directory and Ansible's
version.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import secrets
import shlex
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import InputError, StateError, short_path
from orchestrator.paths import COLLECTION, PLAYBOOKS_DIR, ROOT, state_dir

#: Ansible's own settings (base.yml) that orchestrator reads.
BASE_SETTINGS = (
    "DEFAULT_HOST_LIST",
    "COLLECTIONS_PATHS",
    "DEFAULT_STRATEGY_PLUGIN_PATH",
    "DEFAULT_CALLBACK_PLUGIN_PATH",
    "DEFAULT_STRATEGY",
    "DEFAULT_FORKS",
    "HOST_KEY_CHECKING",
    "DEFAULT_ASK_PASS",
    "DEFAULT_BECOME_ASK_PASS",
    "DEFAULT_ASK_VAULT_PASS",
    "DEFAULT_VAULT_IDENTITY",
    "DEFAULT_VAULT_IDENTITY_LIST",
    "DEFAULT_VAULT_PASSWORD_FILE",
    "ANSIBLE_NOCOWS",
    "DEPRECATION_WARNINGS",
    "LOCALHOST_WARNING",
    "INVENTORY_UNPARSED_WARNING",
)
#: Options of the ssh connection plugin (its documentation defines them): pipelining is one too, and
#: only the plugin's definition knows `[ssh_connection] pipelining`.
SSH_SETTINGS = ("ssh_args", "pipelining")
#: orchestrator's SSH multiplexing: one connection per host for a whole play, kept for the next command.
SSH_MULTIPLEXING = {"controlmaster": "ControlMaster=auto", "controlpersist": "ControlPersist=120s"}
#: Where the user left Ansible's default: (setting, variable, orchestrator's value; "{forks}" is the run's).
OUR_DEFAULTS = (
    ("ssh.pipelining", "ANSIBLE_PIPELINING", "True"),
    ("DEFAULT_STRATEGY", "ANSIBLE_STRATEGY", f"{COLLECTION}.orchestrator_linear"),
    ("DEFAULT_FORKS", "ANSIBLE_FORKS", "{forks}"),
    ("ANSIBLE_NOCOWS", "ANSIBLE_NOCOWS", "True"),
    ("DEPRECATION_WARNINGS", "ANSIBLE_DEPRECATION_WARNINGS", "False"),
    ("LOCALHOST_WARNING", "ANSIBLE_LOCALHOST_WARNING", "False"),
    ("INVENTORY_UNPARSED_WARNING", "ANSIBLE_INVENTORY_UNPARSED_WARNING", "False"),
)
_FORMAT = 2
_CACHE_ENTRIES = 16
_memo: dict[str, AnsibleConfig] = {}


@dataclass(frozen=True)
class Setting:
    value: Any
    #: Where Ansible found it: "default", "env: NAME", or the config file's path.
    origin: str

    @property
    def user_set(self) -> bool:
        return self.origin != "default"


@dataclass(frozen=True)
class AnsibleConfig:
    """The settings orchestrator reads, each with its origin, and the config file Ansible uses (or None)."""

    file: str | None
    settings: dict[str, Setting]

    def __getitem__(self, name: str) -> Setting:
        return self.settings[name]

    def inventory_source(self) -> tuple[Path, str] | None:
        """The inventory the user configured and why (`ANSIBLE_INVENTORY`, `ansible.cfg: PATH`); None
        where it is Ansible's default. orchestrator reads one inventory: several are an error."""
        setting = self["DEFAULT_HOST_LIST"]
        if not setting.user_set:
            return None
        why = "ANSIBLE_INVENTORY" if setting.origin.startswith("env:") else f"ansible.cfg: {setting.origin}"
        sources = [str(s) for s in setting.value or [] if str(s).strip()]
        if len(sources) != 1:
            raise InputError(
                f"{why} names {len(sources)} inventories ({', '.join(sources) or 'none'}); "
                "orchestrator reads one: pass -i INVENTORY"
            )
        return Path(sources[0]), why


def read() -> AnsibleConfig:
    """The user's configuration as Ansible sees it from this directory and environment, now."""
    key = _fingerprint()
    if key is not None and key in _memo:
        return _memo[key]
    found = _cache_get(key) if key else None
    if found is None:
        found = _read_with_ansible()
        if key:
            _cache_put(key, found)
    if key:
        _memo[key] = found
    return found


def collections_dir() -> Path:
    """A folder for ANSIBLE_COLLECTIONS_PATH in which ansible_collections/orchestrator/sglang is ROOT:
    a link made on first use under the cache directory (`$XDG_CACHE_HOME`, else ~/.cache), one per
    ROOT, so that two checkouts or a checkout and a wheel never run each other's content. Ansible
    finds a collection only under a path ending ansible_collections/NAMESPACE/NAME, which neither a
    clone's folder nor the installed package is."""
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    key = hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]
    top = Path(xdg) / "orchestrator" / "collections" / key
    namespace, name = COLLECTION.split(".")
    link = top / "ansible_collections" / namespace / name
    try:
        if link.is_symlink() and Path(os.readlink(link)) == ROOT:
            return top
        link.parent.mkdir(parents=True, exist_ok=True)
        made = link.with_name(f".{name}.{os.getpid()}.{secrets.token_hex(4)}")
        made.symlink_to(ROOT, target_is_directory=True)
        made.replace(link)  # atomic: a play started meanwhile sees the old link or the new one
    except OSError as exc:
        raise StateError(
            f"cannot link orchestrator's Ansible collection at {short_path(link)}: "
            f"{exc.strerror or exc}: point XDG_CACHE_HOME at a writable directory"
        ) from None
    return top


def play_environment(config: AnsibleConfig, forks: int) -> dict[str, str]:
    """The environment variables a play gets on top of the user's own (see the module's docstring)."""
    env = {
        "ANSIBLE_COLLECTIONS_PATH": _search_path(collections_dir(), config["COLLECTIONS_PATHS"].value),
        "ANSIBLE_CALLBACK_PLUGINS": os.pathsep.join(config["DEFAULT_CALLBACK_PLUGIN_PATH"].value or []),
        "ANSIBLE_HOST_KEY_CHECKING": str(bool(config["HOST_KEY_CHECKING"].value)),
        # The CLI asks -K and the vault passwords itself and answers their prompts; any other prompt
        # would wait on a terminal nobody reads.
        "ANSIBLE_ASK_PASS": "False",
        "ANSIBLE_BECOME_ASK_PASS": "False",
        "ANSIBLE_ASK_VAULT_PASS": "False",
    }
    if config.file:
        env["ANSIBLE_CONFIG"] = config.file
    check_mitogen(config)
    for name, variable, ours in OUR_DEFAULTS:
        if not config[name].user_set:
            env[variable] = ours.format(forks=forks)
    ssh_args = merged_ssh_args(config["ssh.ssh_args"])
    if ssh_args is not None:
        env["ANSIBLE_SSH_ARGS"] = ssh_args
    return env


def check_mitogen(config: AnsibleConfig) -> None:
    """Where the user's configuration asks for one of Mitogen's strategies (`strategy = mitogen_linear`),
    the installed Mitogen for Ansible must load into the installed ansible-core, or the play would fail
    on every host with Ansible's traceback: InputError in one line, before anything runs. Mitogen is
    found as ansible-playbook finds it: installed beside orchestrator, or the folder `strategy_plugins`
    names inside an unpacked release (its strategy puts the release on sys.path itself)."""
    setting = config["DEFAULT_STRATEGY"]
    name = str(setting.value or "")
    if not setting.user_set or not name.startswith("mitogen"):
        return
    why = "ANSIBLE_STRATEGY" if setting.origin.startswith("env:") else f"ansible.cfg: {setting.origin}"
    if importlib.util.find_spec("ansible_mitogen") is None:
        for folder in config["DEFAULT_STRATEGY_PLUGIN_PATH"].value or []:
            release = Path(folder).resolve().parents[2] if Path(folder, f"{name}.py").is_file() else None
            if release is not None and (release / "ansible_mitogen").is_dir():
                sys.path.insert(0, str(release))
                break
    try:
        loaders = importlib.import_module("ansible_mitogen.loaders")  # only where a user asks for Mitogen
    except ImportError:
        raise InputError(
            f"{why} asks for strategy {name}, but Mitogen for Ansible is not installed beside orchestrator "
            f"and no strategy_plugins folder holds {name}.py: pip install mitogen (in orchestrator's "
            "environment), or remove the strategy setting"
        ) from None
    import ansible

    try:
        loaders.assert_supported_release()
    except Exception as exc:  # Mitogen raises AnsibleError; any failure here means it cannot run
        said = " ".join(str(exc).split())
        raise InputError(
            f"{why} asks for strategy {name}, but Mitogen {_version('mitogen')} cannot run ansible-core "
            f"{ansible.__version__}: {said} (pip install -U mitogen, or remove the strategy setting)"
        ) from None


def _version(dist: str) -> str:
    with contextlib.suppress(Exception):
        from importlib import metadata

        return metadata.version(dist)
    return "(version unknown)"


def merged_ssh_args(setting: Setting) -> str | None:
    """The ssh_args a play uses: orchestrator's multiplexing where the user left Ansible's default,
    else the user's own with the multiplexing options they do not name appended (ssh takes the first
    value of an option, so theirs win anyway); None when the user's need nothing added."""
    if not setting.user_set:
        return " ".join(f"-o {option}" for option in SSH_MULTIPLEXING.values())
    user = str(setting.value or "")
    named = ssh_option_names(user)
    missing = [f"-o {option}" for key, option in SSH_MULTIPLEXING.items() if key not in named]
    return " ".join([user, *missing]).strip() if missing else None


def ssh_option_names(args: str) -> set[str]:
    """The `-o` options an ssh command line sets, lower-cased (`-o Key=v`, `-oKey=v`, `-o "Key v"`)."""
    try:
        words = shlex.split(args)
    except ValueError:  # unbalanced quotes: ssh would refuse the line anyway
        words = args.split()
    names = set()
    for i, word in enumerate(words):
        option = (
            words[i + 1] if word == "-o" and i + 1 < len(words) else word[2:] if word.startswith("-o") else ""
        )
        key = option.replace("=", " ").split(" ", 1)[0].strip().lower()
        if key:
            names.add(key)
    return names


def _search_path(ours: Path, theirs: list[str] | None) -> str:
    """orchestrator's folder first (its playbooks must get its own collection, not another release of
    orchestrator.sglang a user installed), then every one of the user's."""
    folders = [str(ours), *(str(p) for p in theirs or [] if str(p) != str(ours))]
    return os.pathsep.join(folders)


def _read_with_ansible() -> AnsibleConfig:
    from ansible.config.manager import ConfigManager
    from ansible.errors import AnsibleError

    try:
        manager = ConfigManager()  # finds the file as Ansible does, from this directory and environment
        config_file = manager.get_config_value("CONFIG_FILE")
        home = {"ANSIBLE_HOME": manager.get_config_value("ANSIBLE_HOME")}  # templated defaults use it
        settings = {
            name: Setting(*_plain(manager.get_config_value_and_origin(name, variables=home)))
            for name in BASE_SETTINGS
        }
        manager.initialize_plugin_configuration_definitions("connection", "ssh", _ssh_options())
        for name in SSH_SETTINGS:
            found = manager.get_config_value_and_origin(name, plugin_type="connection", plugin_name="ssh")
            settings[f"ssh.{name}"] = Setting(*_plain(found))
    except AnsibleError as exc:
        where = os.environ.get("ANSIBLE_CONFIG") or "ansible.cfg"
        raise InputError(f"Ansible's configuration ({where}): {str(exc).strip().splitlines()[0]}") from None
    return AnsibleConfig(str(config_file) if config_file else None, settings)


def _ssh_options() -> dict[str, Any]:
    """The ssh connection plugin's option definitions, from its own documentation (as the plugin loader
    reads them, without importing the plugin and its dependencies)."""
    from ansible.parsing.plugin_docs import read_docstring

    spec = importlib.util.find_spec("ansible")
    assert spec is not None and spec.origin is not None
    doc = read_docstring(str(Path(spec.origin).with_name("plugins") / "connection" / "ssh.py"), verbose=False)
    return doc["doc"]["options"]


def _plain(found: tuple[Any, Any]) -> tuple[Any, str]:
    """A value as plain JSON types (Ansible tags its strings with where they came from)."""
    value, origin = found
    return json.loads(json.dumps(value, default=str)), str(origin or "default")


# ---------------------------------------------------------------- cache


def _candidates() -> list[Path]:
    """Every file Ansible might take its configuration from, in its order (see find_ini_config_file)."""
    found = []
    explicit = os.environ.get("ANSIBLE_CONFIG")
    if explicit:
        found += [
            Path(explicit).expanduser().absolute(),
            Path(explicit).expanduser().absolute() / "ansible.cfg",
        ]
    found += [Path.cwd() / "ansible.cfg", Path.home() / ".ansible.cfg", Path("/etc/ansible/ansible.cfg")]
    return found


def _fingerprint() -> str | None:
    try:
        cwd = Path.cwd()
        world_writable = bool(cwd.stat().st_mode & stat.S_IWOTH)  # Ansible skips ./ansible.cfg then
    except OSError:
        return None
    spec = importlib.util.find_spec("ansible")
    release = Path(spec.origin).with_name("release.py") if spec and spec.origin else None
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("ANSIBLE_"))
    files = [_identity(p) for p in [*_candidates(), release] if p]
    parts = [_FORMAT, str(cwd), world_writable, str(Path.home()), env, files, str(PLAYBOOKS_DIR)]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _identity(path: Path) -> list[object]:
    try:
        return [str(path), hashlib.sha256(path.read_bytes()).hexdigest(), os.access(path, os.R_OK)]
    except OSError:
        return [str(path)]


def _cache_path() -> Path:
    return state_dir() / "cache" / "ansible-config.json"


def _cache_get(key: str) -> AnsibleConfig | None:
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        entry = json.loads(_cache_path().read_text()).get(key)
        if entry is not None:
            settings = {name: Setting(*pair) for name, pair in entry["settings"].items()}
            if set(settings) == {*BASE_SETTINGS, *(f"ssh.{n}" for n in SSH_SETTINGS)}:
                return AnsibleConfig(entry["file"], settings)
    return None


def _cache_put(key: str, config: AnsibleConfig) -> None:
    path = _cache_path()
    entries: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        entries = json.loads(path.read_text())
    entries.pop(key, None)
    entries[key] = {
        "file": config.file,
        "settings": {n: [s.value, s.origin] for n, s in config.settings.items()},
    }
    kept = dict(list(entries.items())[-_CACHE_ENTRIES:])
    with contextlib.suppress(OSError):  # a cache that cannot be written only costs time
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(kept))
        tmp.replace(path)
