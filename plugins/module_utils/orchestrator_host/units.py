"""Orchestrator's units on a host: where their files are (from `paths` = {unit_dir, state_dir,
lock_dir}, which the control machine passes; never a default here), which units it deployed,
whether a unit is orchestrator's to overwrite or stop, and a unit text's digest.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING

from .files import read_bytes, read_json

if TYPE_CHECKING:  # never run: the same submodules, named as Mitogen's module finder needs them
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.files  # noqa: F401


def unit_digest(data: bytes) -> str:
    """Identifies a unit text; the same rule as orchestrator/render/launch.py Plan.digest."""
    return hashlib.sha256(data).hexdigest()[:16]


def unit_path(paths: dict, unit: str) -> str:
    return os.path.join(paths["unit_dir"], unit)


def facts_path(paths: dict, unit: str) -> str:
    """The UnitFacts of the installed unit (written by sglang_unit with it)."""
    return os.path.join(paths["state_dir"], "units", f"{unit}.json")


def record_path(paths: dict, unit: str) -> str:
    """The last unit that served healthy here (written by sglang_record)."""
    return os.path.join(paths["state_dir"], "last-good", f"{unit}.json")


def lock_path(paths: dict, unit: str) -> str:
    """The deploy lock; lock_dir is on tmpfs, so a reboot ends every deploy and its lock."""
    return os.path.join(paths["lock_dir"], f"{unit}.lock")


#: How every unit orchestrator writes begins (templates/sglang.service.j2's `ansible_managed`
#: line, orchestrator/render/launch.py MANAGED as a comment; tests/unit/modules prove they agree).
MANAGED_MARK = b"# Managed by orchestrator:"

#: What `systemctl show` tells of where a unit comes from (foreign_unit).
OWNER_PROPS = ("Id", "LoadState", "FragmentPath")


def foreign_unit(state: dict[str, str], paths: dict, unit: str) -> str:
    """Why `unit` is not orchestrator's to overwrite or stop on this host ('' when it is), from
    `systemctl show`'s OWNER_PROPS of it.

    Ours: a unit systemd does not know, or one it loads from our own file in unit_dir that carries
    MANAGED_MARK or has our facts (units/<unit>.json, which sglang_unit writes with every unit it
    installs). A unit file anywhere else (/lib/systemd/system/ssh.service, a generator's, another
    unit that `unit` is an alias of) would be overridden or shadowed by ours; a file in unit_dir
    with neither mark nor facts is someone's own. Masked units are foreign_write's."""
    ours = unit_path(paths, unit)
    fragment = state.get("FragmentPath", "")
    if fragment and os.path.normpath(fragment) != os.path.normpath(ours):
        real = state.get("Id", "")
        alias = f" as an alias of {real}" if real and real != unit else ""
        return f"{unit} is not orchestrator's: systemd loads it{alias} from {fragment}"
    data = read_bytes(ours)
    if data is not None and not data.startswith(MANAGED_MARK) and not os.path.exists(facts_path(paths, unit)):
        return (
            f"{unit} is not orchestrator's: {ours} has no '{MANAGED_MARK.decode()}' line and no facts in "
            f"{os.path.dirname(facts_path(paths, unit))}"
        )
    return ""


def foreign_write(state: dict[str, str], paths: dict, unit: str) -> str:
    """Why orchestrator may not write `unit`'s file ('' when it may): foreign_unit, or masked
    (a link to /dev/null, which the write would replace: someone wants it never to start)."""
    if state.get("LoadState") == "masked":
        where = state.get("FragmentPath") or unit_path(paths, unit)
        return f"{unit} is masked on this host ({where}): `systemctl unmask {unit}` if it is to run"
    return foreign_unit(state, paths, unit)


def deployed_units(paths: dict) -> dict[str, dict]:
    """Every unit orchestrator deployed on this host, as {unit: its stored facts}: sglang_unit
    writes units/<unit>.json with each unit it installs. Sorted by name."""
    folder = os.path.join(paths["state_dir"], "units")
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return {}
    return {
        name.removesuffix(".json"): read_json(os.path.join(folder, name))
        for name in names
        if name.endswith(".json") and not name.startswith(".")  # not write_atomic's temporary files
    }


def installed_units(paths: dict) -> dict[str, dict]:
    """deployed_units whose unit file is still installed (a unit removed by hand leaves its
    facts behind: it runs no more, and takes no port)."""
    return {u: f for u, f in deployed_units(paths).items() if os.path.isfile(unit_path(paths, u))}
