"""Reading the user's Ansible inventory with Ansible's own code: host order, addresses, variables.

Patterns (`--limit`), groups, group_vars and INI/YAML all mean what they mean to Ansible.

Importing Ansible and parsing costs about 0.3 s, a fifth of a no-op deploy. So what a read found is
kept in the state directory, under a fingerprint of everything it depended on. That is the inventory
files, the group_vars/ and host_vars/ beside them, Ansible's config files and ANSIBLE_* variables,
and Ansible's version. Any change there reads the inventory again.

Some inventories are read every time. These are dynamic inventories (scripts, plugin configs such
as aws_ec2), and inventories with vaulted files or `!vault` values. Each read of a vaulted one checks
that it decrypts. So a wrong vault password is one line naming the file, before any play.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import stat
import threading
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import InputError
from orchestrator.hosts import vault
from orchestrator.paths import PLAYBOOKS_DIR, state_dir

#: Plugins that read a static file: their result depends on nothing but the fingerprinted files.
STATIC_PLUGINS = frozenset({"yaml", "ini", "toml"})
#: Entries kept in the cache file (one per inventory and --limit).
CACHE_ENTRIES = 64
#: Files up to this size are fingerprinted by content, larger ones by stat.
MAX_HASHED = 1 << 20
_FORMAT = 3


@dataclass(frozen=True)
class InventoryHost:
    name: str
    address: str
    #: The host's `orchestrator_deployment` variable (fleet or multinode), if set.
    deployment: str | None = None
    #: `orchestrator_gateway_url`: the SGLang gateway (smg) that routes to this host's server.
    gateway_url: str | None = None
    #: `orchestrator_gateway_worker_url`: the URL the gateway knows this host's server by
    #: (None: http://ADDRESS:PORT).
    gateway_worker_url: str | None = None
    #: prefill or decode: the host is in the inventory group of that name (a PD fleet, docs/pd.md).
    pd_role: str | None = None


def hosts(inventory: Path, limit: str | None = None) -> list[InventoryHost]:
    """The hosts `limit` selects, in inventory order.

    Raises InputError when the inventory does not exist, Ansible cannot parse it (naming each
    plugin's reason), or it holds no host at all; a `limit` matching nothing gives [].
    """
    if not inventory.exists():
        raise InputError(f"inventory {inventory} does not exist")
    key = _fingerprint(inventory, limit)
    cached = _cache_get(key) if key else None
    if cached is not None:
        return cached
    selected, plugins = _read(inventory, limit)
    if key and plugins <= STATIC_PLUGINS:
        _cache_put(key, selected)
    return selected


def host_names(inventory: Path, limit: str | None = None) -> list[str]:
    return [h.name for h in hosts(inventory, limit)]


def selected(inventory: Path, limit: str | None = None) -> list[InventoryHost]:
    """hosts(), refusing a selection with no host in it (bad input)."""
    found = hosts(inventory, limit)
    if not found:
        raise no_match(inventory, limit)
    return found


def no_match(inventory: Path, limit: str | None) -> InputError:
    """The error for an inventory, or a --limit, that selects no host."""
    return InputError(f"no host of {inventory} matched{f' --limit {limit}' if limit else ''}")


def check(inventory: Path) -> None:
    """Refuse an inventory that Ansible cannot parse or that names no host, before any play.

    ansible-playbook only warns about an unparsable inventory, then plays against the
    implicit localhost alone: a broken file would read as "no host matched" at best.
    """
    hosts(inventory)


def _read(inventory: Path, limit: str | None) -> tuple[list[InventoryHost], set[str]]:
    """Parse with Ansible: the selected hosts, and the plugins that parsed the sources."""
    with _READING:
        count, reasons, plugins = _parse_sources(inventory)
    if count is None:
        why = "; ".join(reasons) or "no file in it parsed"
        raise InputError(f"inventory {inventory}: {why}")
    if count == 0:
        raise InputError(f"inventory {inventory}: Ansible parsed it but found no hosts in it")
    selected = []
    for name, merged in host_variables(inventory, limit).items():
        address = str(vault.plain(merged.get("ansible_host"), "ansible_host") or name)
        found = {
            var: vault.plain(merged.get(var), var)
            for var in (
                "orchestrator_deployment",
                "orchestrator_gateway_url",
                "orchestrator_gateway_worker_url",
            )
        }
        deployment, gateway_url, worker_url = (None if v is None else str(v) for v in found.values())
        pd_role = _pd_role(inventory, name, merged.get("group_names") or [])
        selected.append(InventoryHost(name, address, deployment, gateway_url, worker_url, pd_role))
    return selected, plugins


#: The inventory groups of a prefill/decode fleet: a host in one serves that role.
PD_GROUPS = ("prefill", "decode")


def _pd_role(inventory: Path, host: str, groups: list[str]) -> str | None:
    roles = [g for g in PD_GROUPS if g in groups]
    if len(roles) > 1:
        raise InputError(
            f"inventory {inventory}: host {host} is in both groups prefill and decode; "
            "a server has one role: take it out of one group"
        )
    return roles[0] if roles else None


def host_variables(inventory: Path, limit: str | None = None) -> dict[str, dict[str, Any]]:
    """Each selected host's variables as Ansible merges them from the inventory (its group_vars and
    host_vars included), in inventory order, uncached. Vaulted files and `!vault` values are decrypted with
    the vault secrets (vault.secrets()); one that does not decrypt is an InputError naming it."""
    with _READING:
        return _host_variables(inventory, limit)


#: Ansible's inventory classes keep process-wide caches: one reader at a time (a tune campaign
#: deploys from one thread per host).
_READING = threading.RLock()


def _host_variables(inventory: Path, limit: str | None) -> dict[str, dict[str, Any]]:
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.plugins.vars import host_group_vars
    from ansible.vars.manager import VariableManager

    # Ansible remembers which group_vars/host_vars files exist, and where a source's folder is, for the
    # life of the process; one that reads twice (a sweep, the tests) must see files added in between.
    host_group_vars.FOUND.clear()
    host_group_vars.NAK.clear()
    host_group_vars.CANONICAL_PATHS.clear()
    loader = vault.loader()
    try:
        manager = InventoryManager(loader=loader, sources=[str(inventory.absolute())])
        if limit:
            manager.subset(limit)
        variables = VariableManager(loader=loader, inventory=manager)
        found = {}
        for host in manager.get_hosts("all"):
            found[host.name] = variables.get_vars(host=host, include_hostvars=False)
            vault.check_decrypts(found[host.name])
    except AnsibleError as exc:
        line = vault.explain(exc)
        if line is None:
            raise
        raise InputError(line) from None
    return found


def _parse_sources(source: Path) -> tuple[int | None, list[str], set[str]]:
    """Hosts in `source` (None: nothing parsed), why each plugin refused it, and which parsed it.

    Asks the enabled plugins in turn, as ansible-core's InventoryManager.parse_source does,
    because the manager keeps the plugins' reasons to itself and only prints warnings.
    """
    from ansible import constants as C
    from ansible.inventory.data import InventoryData
    from ansible.inventory.manager import IGNORED
    from ansible.plugins.loader import inventory_loader

    loader = vault.loader()  # before any plugin: a vault password file that fails is its own error
    if source.is_dir():  # like Ansible: the directory parses if any file in it does
        entries = [p for p in sorted(source.iterdir()) if not IGNORED.search(os.fsencode(p.name))]
        parts = [_parse_sources(p) for p in entries]
        counts = [n for n, _, _ in parts if n is not None]
        reasons = [r for _, why, _ in parts for r in why]
        return (sum(counts) if counts else None), reasons, {p for _, _, used in parts for p in used}
    reasons = []
    for name in C.INVENTORY_ENABLED:
        plugin = inventory_loader.get(name)
        try:
            if not (plugin and plugin.verify_file(str(source))):
                continue
            data = InventoryData()
            plugin.parse(data, loader, str(source), cache=False)
            return len(data.hosts), [], {name}
        except Exception as exc:  # Ansible catches every plugin failure the same way
            if vault.explain(exc):  # a vaulted inventory file: every plugin would say the same
                raise InputError(str(vault.explain(exc))) from None
            first_line = str(exc).strip().partition("\n")[0]
            if not any(r.endswith(f": {first_line}") for r in reasons):  # `auto` repeats `yaml`
                reasons.append(f"{name} plugin: {first_line}")
    return None, reasons, set()


def _fingerprint(inventory: Path, limit: str | None) -> str | None:
    """A digest of everything Ansible's answer depends on; None when that cannot be known
    without running something (an executable inventory is a script)."""
    root = inventory.resolve()
    files = sorted(root.rglob("*")) if root.is_dir() else [root]
    if any(p.is_file() and os.access(p, os.X_OK) for p in files):
        return None
    beside = {root if root.is_dir() else root.parent, PLAYBOOKS_DIR}
    for base in sorted(beside):
        for sub in ("group_vars", "host_vars"):
            files += [base / sub, *sorted((base / sub).rglob("*"))]
    if any(_holds_vault(p) for p in files):
        return None
    ansible_spec = importlib.util.find_spec("ansible")
    release = (
        Path(ansible_spec.origin).with_name("release.py") if ansible_spec and ansible_spec.origin else None
    )
    configs = [Path("ansible.cfg").resolve(), Path.home() / ".ansible.cfg", Path("/etc/ansible/ansible.cfg")]
    if os.environ.get("ANSIBLE_CONFIG"):
        configs.append(Path(os.environ["ANSIBLE_CONFIG"]))
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("ANSIBLE_"))
    parts = [_FORMAT, str(root), limit, env, [_identity(p) for p in [*files, *configs, release] if p]]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _holds_vault(path: Path) -> bool:
    """Whether a file is vaulted or holds a `!vault` value."""
    try:
        return path.is_file() and vault.HEADER in path.read_bytes()
    except OSError:
        return False


def _identity(path: Path) -> list[object]:
    """What a file holds: its content's digest (inventories and vars files are small; timestamps
    can miss two writes within a clock tick), or for a large one its stat; a directory or a
    missing path counts by name, its files by their own entries."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            return [str(path), "dir" if stat.S_ISDIR(st.st_mode) else "other"]
        if st.st_size > MAX_HASHED:
            return [str(path), st.st_mtime_ns, st.st_size, st.st_ino]
        return [str(path), hashlib.sha256(path.read_bytes()).hexdigest()]
    except OSError:
        return [str(path)]


def _cache_path() -> Path:
    return state_dir() / "cache" / "inventory.json"


def _cache_get(key: str) -> list[InventoryHost] | None:
    with contextlib.suppress(OSError, ValueError, TypeError):
        entry = json.loads(_cache_path().read_text()).get(key)
        if entry is not None:
            return [InventoryHost(*row) for row in entry]
    return None


def _cache_put(key: str, selected: list[InventoryHost]) -> None:
    path = _cache_path()
    entries: dict[str, list[list[str | None]]] = {}
    with contextlib.suppress(OSError, ValueError):
        entries = json.loads(path.read_text())
    entries.pop(key, None)
    entries[key] = [list(astuple(h)) for h in selected]
    kept = dict(list(entries.items())[-CACHE_ENTRIES:])
    with contextlib.suppress(OSError):  # a cache that cannot be written only costs time
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(kept))
        tmp.replace(path)
