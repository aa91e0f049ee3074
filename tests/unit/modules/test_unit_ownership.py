"""Which units orchestrator may overwrite or stop on a host (#21): foreign_unit and foreign_write
of module_utils/orchestrator_host/units.py, against what systemd itself says of a unit search path.

No systemd runs here to answer `systemctl show`, but `systemd --test` loads units as PID 1 does
(the same search path, aliases, masks) and dumps each one's load state and fragment path: the
values `systemctl show --property=Id,LoadState,FragmentPath` reads from the same unit object. It
runs as nobody over directories of its own, as tests/unit/test_systemd_oracle.py does.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.procs import cgroup_unit
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.units import (
    MANAGED_MARK,
    foreign_unit,
    foreign_write,
)
from hostfakes import MANAGED

from orchestrator.profile import model as profile_mod
from orchestrator.render import launch

SYSTEMD = Path("/lib/systemd/systemd")
STUBS = ["sysinit.target", "basic.target", "shutdown.target", "system.slice", "rescue.target"]
SERVICE = "[Service]\nExecStart=/bin/true\n"
#: The units laid out: run/ (/run/systemd/system) before etc/ (unit_dir, /etc/systemd/system)
#: before lib/ (/lib/systemd/system), as systemd searches them.
UNITS = [
    "ssh.service",  # a package's, in lib/
    "sshd.service",  # etc/sshd.service -> lib/ssh.service: an alias, as Debian's openssh enables it
    "hand.service",  # an admin's own file in etc/
    "ours.service",  # ours, with our header line
    "facts.service",  # ours by its facts (an older unit without the header)
    "masked.service",  # etc/masked.service -> /dev/null
    "ours-masked.service",  # ours, masked by an admin
    "shadowed.service",  # ours in etc/, and another in run/, which systemd loads instead
    "new.service",  # nowhere yet
]


def _systemd_shows(root: Path) -> dict[str, dict[str, str]]:
    """{unit: its Id, LoadState and FragmentPath} as `systemd --test` loads `main.service`, which
    wants every one of UNITS."""
    if not SYSTEMD.exists():
        pytest.skip(f"{SYSTEMD} is missing: systemd is not installed here")
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("setpriv is missing: cannot run systemd's test mode as an unprivileged user")
        prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    search = ":".join(str(root / d) for d in ("run", "etc", "lib", "stubs"))
    test_mode = ["--test", "--system", "--unit=main.service", "--no-pager"]
    result = subprocess.run(
        [*prefix, "env", "-i", f"SYSTEMD_UNIT_PATH={search}", str(SYSTEMD), *test_mode],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    shows = {}
    for block in result.stdout.split("\t-> Unit ")[1:]:
        name = block.split(":\n", 1)[0]
        state = {
            "Id": name,
            "LoadState": re.search(r"^\t\tUnit Load State: (.*)$", block, re.M).group(1),
            "FragmentPath": next(iter(re.findall(r"^\t\tFragment Path: (.*)$", block, re.M)), ""),
        }
        for alias in [name, *re.findall(r"^\t\tAlias: (.*)$", block, re.M)]:
            shows[alias] = state
    return shows


@pytest.fixture(scope="module")
def host() -> Iterator[tuple[dict[str, dict[str, str]], dict[str, str]]]:
    """(what systemd says of each of UNITS, the paths of a host whose unit_dir is etc/)."""
    with tempfile.TemporaryDirectory(prefix="unit-ownership-") as tmp:
        root = Path(tmp)
        for folder in ("run", "etc", "lib", "stubs", "state/units"):
            (root / folder).mkdir(parents=True)
        for stub in STUBS:
            (root / "stubs" / stub).write_text("[Unit]\nDefaultDependencies=no\n")
        (root / "stubs" / "main.service").write_text(f"[Unit]\nWants={' '.join(UNITS)}\n{SERVICE}")
        (root / "lib" / "ssh.service").write_text(SERVICE)
        (root / "etc" / "sshd.service").symlink_to(root / "lib" / "ssh.service")
        (root / "etc" / "hand.service").write_text(SERVICE)
        for ours in ("ours.service", "shadowed.service"):
            (root / "etc" / ours).write_text(MANAGED + SERVICE)
        (root / "run" / "shadowed.service").write_text(SERVICE)
        (root / "etc" / "facts.service").write_text(SERVICE)
        (root / "etc" / "masked.service").symlink_to("/dev/null")
        (root / "etc" / "ours-masked.service").symlink_to("/dev/null")
        for ours in ("facts.service", "ours-masked.service"):
            (root / "state" / "units" / f"{ours}.json").write_text("{}")
        for path in [root, *root.rglob("*")]:
            if not path.is_symlink():
                path.chmod(0o755 if path.is_dir() else 0o644)
        paths = {
            "unit_dir": str(root / "etc"),
            "state_dir": str(root / "state"),
            "lock_dir": str(root / "lock"),
        }
        yield _systemd_shows(root), paths


@pytest.mark.parametrize(
    ("unit", "foreign", "write"),
    [
        ("ssh.service", "ssh.service is not orchestrator's: systemd loads it from {lib}/ssh.service", None),
        (
            "sshd.service",
            "sshd.service is not orchestrator's: systemd loads it as an alias of ssh.service from "
            "{lib}/ssh.service",
            None,
        ),
        (
            "hand.service",
            "hand.service is not orchestrator's: {etc}/hand.service has no '# Managed by orchestrator:' line "
            "and no facts in {state}/units",
            None,
        ),
        ("ours.service", "", ""),
        ("facts.service", "", ""),
        (
            "masked.service",
            "masked.service is not orchestrator's: {etc}/masked.service has no '# Managed by orchestrator:' "
            "line and no facts in {state}/units",
            "masked.service is masked on this host ({etc}/masked.service): "
            "`systemctl unmask masked.service` if it is to run",
        ),
        (
            "ours-masked.service",
            "",
            "ours-masked.service is masked on this host ({etc}/ours-masked.service): "
            "`systemctl unmask ours-masked.service` if it is to run",
        ),
        (
            "shadowed.service",
            "shadowed.service is not orchestrator's: systemd loads it from {run}/shadowed.service",
            None,
        ),
        ("new.service", "", ""),
    ],
)
def test_only_units_of_ours_or_of_nobody_may_be_stopped_or_written(host, unit, foreign, write):
    shows, paths = host
    root = Path(paths["unit_dir"]).parent
    where = {name: str(root / name) for name in ("run", "etc", "lib", "state")}
    state = shows.get(unit, {"Id": unit, "LoadState": "not-found", "FragmentPath": ""})
    assert foreign_unit(state, paths, unit) == foreign.format(**where)
    assert foreign_write(state, paths, unit) == (foreign if write is None else write).format(**where)


def test_systemd_says_how_a_unit_nobody_has_is_loaded(host):
    """What foreign_unit reads as free: systemd knows the name and has no file for it."""
    assert host[0]["new.service"] == {"Id": "new.service", "LoadState": "not-found", "FragmentPath": ""}


def test_every_unit_plan_renders_carries_the_mark_the_host_looks_for():
    """The header line is what tells a unit orchestrator wrote when its facts are gone."""
    for name in ("cg_5tok", "example:base"):
        assert launch.build(profile_mod.load(name)).unit.encode().startswith(MANAGED_MARK)


@pytest.mark.parametrize(
    ("unit", "cgroup"),
    [
        ("sglang.service", "sglang.service"),
        ("_sglang.service", "__sglang.service"),
        ("cpu.service", "_cpu.service"),
        ("memory.service", "_memory.service"),
        ("a.cpu.service", "a.cpu.service"),
        ("cgroup.service", "_cgroup.service"),
    ],
)
def test_a_units_processes_are_found_under_the_cgroup_name_systemd_gives_it(unit, cgroup):
    """cg_escape(): systemd puts `cpu.service` in the cgroup `_cpu.service`, where a process of it
    was taken for a process of no unit of ours (a GPU holder, a port taken by someone else)."""
    assert cgroup_unit(f"0::/system.slice/{cgroup}\n", {unit, "other.service"}) == unit
    if cgroup != unit:
        assert cgroup_unit(f"0::/system.slice/{unit}\n", {unit}) == ""
