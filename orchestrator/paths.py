"""Where things live: the project's own files, and the state directory outside the repo."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

#: The package's own folder.
PACKAGE_DIR = Path(__file__).resolve().parent
#: The source checkout this runs from (a clone, or an editable install of one), or None for an
#: installed wheel. A checkout keeps playbooks/, roles/, plugins/, meta/, templates/ and profiles/
#: at its top level; the wheel carries them inside the package (pyproject.toml maps them in).
CHECKOUT: Path | None = None if (PACKAGE_DIR / "playbooks").is_dir() else PACKAGE_DIR.parent
#: The folder holding playbooks/, roles/, templates/ and profiles/: the checkout, else the package.
#: It is also the root of the Ansible collection orchestrator.sglang (galaxy.yml, meta/runtime.yml,
#: plugins/, roles/, playbooks/), the one copy of the content the CLI runs.
ROOT = CHECKOUT or PACKAGE_DIR
#: The collection's name (galaxy.yml's namespace and name): FQCNs are COLLECTION.sglang_probe.
COLLECTION = "orchestrator.sglang"
#: The example profiles shipped with the tool (`example:NAME`): the checkout's profiles/.
EXAMPLES_DIR = ROOT / "profiles"
TEMPLATES_DIR = ROOT / "templates"
PLAYBOOKS_DIR = ROOT / "playbooks"
ROLES_DIR = ROOT / "roles"
#: The collection's modules (orchestrator.sglang.NAME), used by the roles.
MODULES_DIR = ROOT / "plugins" / "modules"
#: Host-side code shared by the modules
#: (ansible_collections.orchestrator.sglang.plugins.module_utils on a host).
MODULE_UTILS_DIR = ROOT / "plugins" / "module_utils"


#: The name plugins/module_utils has when the control machine loads it itself (module_utils()).
_MODULE_UTILS_PACKAGE = "orchestrator_module_utils"


def module_utils(name: str) -> ModuleType:
    """plugins/module_utils/NAME.py, or a submodule of a package there (orchestrator_host.systemd),
    loaded on the control machine as it is shipped to hosts (its pure functions: the gateway
    client, the host's parsers), once per process. Only that file and what it imports are loaded:
    a package's submodules import each other relatively, so they need no collection loader."""
    if _MODULE_UTILS_PACKAGE not in sys.modules:
        spec = importlib.machinery.ModuleSpec(_MODULE_UTILS_PACKAGE, None, is_package=True)
        spec.submodule_search_locations = [str(MODULE_UTILS_DIR)]
        sys.modules[_MODULE_UTILS_PACKAGE] = importlib.util.module_from_spec(spec)
    return importlib.import_module(f"{_MODULE_UTILS_PACKAGE}.{name}")


def state_dir() -> Path:
    """`$ORCHESTRATOR_STATE_DIR`, else `$XDG_STATE_HOME/orchestrator`, else ~/.local/state/orchestrator."""
    explicit = os.environ.get("ORCHESTRATOR_STATE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "orchestrator"


def host_imports() -> None:
    """Make `ansible_collections.orchestrator.sglang.plugins.module_utils` this ROOT's plugins/module_utils
    in this process, the name the collection's modules import it by on a host, so that the unit tests
    and scripts/role_specs.py can import those modules as files. Only that package is named (its
    parents are empty namespaces): Ansible's own collection loader, with its import hooks, is left
    to Ansible's processes."""
    name = "ansible_collections." + COLLECTION + ".plugins.module_utils"
    if name in sys.modules:
        return
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        if prefix not in sys.modules:
            spec = importlib.machinery.ModuleSpec(prefix, None, is_package=True)
            spec.submodule_search_locations = [str(MODULE_UTILS_DIR)] if prefix == name else []
            sys.modules[prefix] = importlib.util.module_from_spec(spec)
