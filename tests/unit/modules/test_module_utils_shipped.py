"""What Ansible ships with each of the collection's modules (issue 24): module_utils/orchestrator_host is a
package of one submodule a concern, and a module's payload carries the submodules it imports and
what those import, never the whole package for a module that uses a part of it. Found by
ansible-core's own finder on the real module files (ansiballz_files.py), as a run builds them."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.hosts.ansible_config import collections_dir
from orchestrator.paths import MODULE_UTILS_DIR, MODULES_DIR, ROOT

HERE = Path(__file__).parent
HOST = MODULE_UTILS_DIR / "orchestrator_host"
#: What a module needs beside the package's __init__.py: the submodules it imports itself, and
#: theirs (gpus reads cgroups and container labels, and the units deployed here; preflight reads
#: everything but the lock and health, and sizes the model's weights from their files).
GPUS = {"gpus", "procs", "containers", "units", "files"}
PREFLIGHT = {"preflight", "systemd", "modelfiles", "memfit", *GPUS}
#: Every module hands AnsibleModule its ARGUMENT_SPEC through options.module_spec.
#: The steps of a restart, each in a submodule of its own: its module, and the transaction, run it.
STOP = {"stop", "options", "systemd", *GPUS}
UNIT = {"unitfile", "options", "systemd", "units", "files"}
START = {"start", "systemd", "options"}
HEALTH = {"healthwait", "health", "systemd", "startup", "options"}
RECORD = {"record", "options", "lock", "units", "files"}
#: Servers started by hand: found in /proc, taken over (sglang_restart's first step), started again.
ADOPT = {"adopt", "options", "health", *GPUS}
NEEDS: dict[str, set[str]] = {
    "gpu_idle": {"options", *GPUS},
    "sglang_drain": {"options", "health", "orchestrator_gateway"},
    "sglang_gateway": {"options", "orchestrator_gateway"},
    "sglang_health_wait": HEALTH,
    "sglang_lock": {"options", "lock", "units", "files"},
    "sglang_preflight": {"options", *PREFLIGHT},
    "sglang_adopt": ADOPT,
    "sglang_probe": {"options", "lock", "health", *PREFLIGHT, *ADOPT},
    "sglang_record": RECORD,
    "sglang_start": START,
    "sglang_stop": STOP,
    "sglang_unit": UNIT,
    "sglang_restart": ADOPT | STOP | UNIT | START | HEALTH | RECORD,
    "sglang_units_info": ADOPT,
}
MODULE_FILES = sorted(MODULES_DIR.glob("*.py"))
#: Where a payload puts plugins/module_utils.
SHIPPED_AS = "ansible_collections/orchestrator/sglang/plugins/module_utils"
SUBMODULES = {p.stem for p in HOST.glob("*.py")} - {"__init__"}


def _ours(needs: set[str]) -> set[str]:
    """module_utils files, as the payload names them, for the names of NEEDS."""
    files = {f"orchestrator_host/{n}.py" for n in needs & SUBMODULES}
    files |= {"orchestrator_host/__init__.py"} if files else set()
    return {f"{SHIPPED_AS}/{f}" for f in files | {f"{n}.py" for n in needs - SUBMODULES}}


@pytest.fixture(scope="module")
def payloads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """{module name: the files of plugins/module_utils in its payload}."""
    env = {k: v for k, v in os.environ.items() if k != "ANSIBLE_CONFIG"}
    env["ANSIBLE_COLLECTIONS_PATH"] = str(collections_dir())
    done = subprocess.run(
        [sys.executable, HERE / "ansiballz_files.py", *map(str, MODULE_FILES)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path_factory.mktemp("ansiballz"),  # no ansible.cfg of the checkout's
        check=False,
    )
    assert done.returncode == 0, done.stderr
    mine = {f"{SHIPPED_AS}/{p.relative_to(MODULE_UTILS_DIR)}" for p in MODULE_UTILS_DIR.rglob("*.py")}
    return {Path(path).stem: set(names) & mine for path, names in json.loads(done.stdout).items()}


def test_every_module_is_listed_and_every_submodule_used() -> None:
    assert {p.stem for p in MODULE_FILES} == set(NEEDS)
    assert set().union(*NEEDS.values()) == SUBMODULES | {"orchestrator_gateway"}


@pytest.mark.parametrize("module", sorted(NEEDS))
def test_a_module_ships_the_submodules_it_uses_and_no_others(
    payloads: dict[str, set[str]], module: str
) -> None:
    assert payloads[module] == _ours(NEEDS[module])


def test_only_the_probe_ships_the_whole_host_package(payloads: dict[str, set[str]]) -> None:
    """sglang_probe takes the lock, runs preflight and reads health: it uses every concern but the
    start-up log parser, which only the health wait reads, and the steps of a restart."""
    whole = _ours(SUBMODULES - {"startup", "stop", "unitfile", "start", "healthwait", "record"})
    assert [m for m, files in payloads.items() if files >= whole] == ["sglang_probe"]


def test_the_package_init_imports_nothing() -> None:
    """Shipped with every submodule: an import there would ship its target with each."""
    body = ast.parse((HOST / "__init__.py").read_text()).body
    assert [type(node) for node in body] == [ast.Expr]  # its docstring


def test_the_control_machine_loads_only_the_submodules_it_reads() -> None:
    """systemd_check reads unit_complaints on every render, and verify the process and container
    parsers: each loads that file and what it imports, and no part of Ansible."""
    code = (
        "import json, sys\n"
        "from orchestrator.paths import module_utils\n"
        "module_utils(sys.argv[1])\n"
        "ours = ('orchestrator_module_utils', 'ansible')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(ours))))\n"
    )
    loaded = {}
    for name in ("orchestrator_host.systemd", "orchestrator_host.containers", "orchestrator_host.lock"):
        done = subprocess.run(
            [sys.executable, "-c", code, name], capture_output=True, text=True, cwd=ROOT, check=True
        )
        loaded[name] = [m.removeprefix("orchestrator_module_utils") for m in json.loads(done.stdout)]
    assert loaded == {
        "orchestrator_host.systemd": ["", ".orchestrator_host", ".orchestrator_host.systemd"],
        "orchestrator_host.containers": ["", ".orchestrator_host", ".orchestrator_host.containers"],
        "orchestrator_host.lock": [
            "",
            ".orchestrator_host",
            ".orchestrator_host.files",
            ".orchestrator_host.lock",
            ".orchestrator_host.units",
        ],
    }
