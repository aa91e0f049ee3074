"""Each role says the same thing four times: defaults/main.yml, meta/argument_specs.yml, its
module's argument_spec and the module's DOCUMENTATION. They must agree in names, types,
defaults and requiredness (a role variable is the module option with the role's prefix), and
the role's task must pass every option from its variable. Host paths come from Python only:
no default anywhere repeats one."""

from __future__ import annotations

import ast
import importlib.util
import types
from pathlib import Path
from typing import Any

import ansible.module_utils
import pytest
import yaml

from orchestrator.hostplan import HostPaths, LockSpec, PreflightChecks
from orchestrator.paths import MODULE_UTILS_DIR, ROLES_DIR

if str(MODULE_UTILS_DIR) not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(MODULE_UTILS_DIR))

from ansible.module_utils import orchestrator_host as host  # found through the path above

#: The module each role's tasks/main.yml runs.
ROLE_MODULE = {
    "gpu_idle": "gpu_idle",
    "sglang_drain": "sglang_drain",
    "sglang_gateway": "sglang_gateway",
    "sglang_health": "sglang_health_wait",
    "sglang_preflight": "sglang_preflight",
    "sglang_probe": "sglang_probe",
    "sglang_record": "sglang_record",
    "sglang_service": "sglang_start",
    "sglang_stop": "sglang_stop",
    "sglang_unit": "sglang_unit",
    "sglang_units": "sglang_units_info",
}
#: Role variables whose option is not the name less the role's prefix.
RENAMED = {
    "sglang_unit_name": "unit_name",  # the prefix sglang_unit_ eats the option's own "unit_"
    "sglang_health_unit_name": "unit",  # sglang_health_wait's options predate the role's names
    "sglang_record_unit_content": "unit",  # the option is the record's own key
}
HOST_PATHS = ("/etc/systemd/system", "/etc/orchestrator", "/run/orchestrator")
MODULE_FILES = sorted(ROLES_DIR.glob("*/library/*.py"))


def load(path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def role_spec(role: str, entry: str = "main") -> dict[str, dict]:
    specs = yaml.safe_load((ROLES_DIR / role / "meta/argument_specs.yml").read_text())
    return specs["argument_specs"][entry]["options"]


def option_name(role: str, var: str) -> str:
    assert var.startswith(f"{role}_"), f"{var} lacks the role's prefix"
    return RENAMED.get(var, var.removeprefix(f"{role}_"))


def norm(spec: dict[str, dict]) -> dict[str, dict[str, Any]]:
    """What must agree about each option, from an argument_spec, argument_specs.yml or DOCUMENTATION."""
    out = {}
    for name, opt in spec.items():
        sub = opt.get("options") or opt.get("suboptions")
        out[name] = {
            "type": opt.get("type", "str"),
            "elements": opt.get("elements"),
            "required": bool(opt.get("required", False)),
            "default": opt.get("default"),
            "options": norm(sub) if sub else None,
        }
    return out


def test_every_role_is_known():
    assert sorted(p.name for p in ROLES_DIR.iterdir() if p.is_dir()) == sorted(ROLE_MODULE)


@pytest.mark.parametrize("role", sorted(ROLE_MODULE))
def test_defaults_are_exactly_the_options_with_a_default(role):
    defaults = yaml.safe_load((ROLES_DIR / role / "defaults/main.yml").read_text()) or {}
    options = role_spec(role)
    assert defaults == {name: opt["default"] for name, opt in options.items() if "default" in opt}
    for name, opt in options.items():
        assert not (opt.get("required") and "default" in opt), f"{name} is required and has a default"
        assert opt.get("required") or "default" in opt, f"{name} is neither required nor has a default"


@pytest.mark.parametrize("role", sorted(r for r, m in ROLE_MODULE.items() if m))
def test_role_variables_are_the_modules_options(role):
    module = load(ROLES_DIR / role / "library" / f"{ROLE_MODULE[role]}.py")
    options = {option_name(role, var): opt for var, opt in role_spec(role).items()}
    assert norm(options) == norm(module.ARGUMENT_SPEC)


@pytest.mark.parametrize("path", MODULE_FILES, ids=lambda p: p.stem)
def test_documentation_matches_the_argument_spec(path):
    module = load(path)
    doc = yaml.safe_load(module.DOCUMENTATION)
    assert doc["module"] == path.stem
    assert norm(doc["options"]) == norm(module.ARGUMENT_SPEC)
    assert set(doc["attributes"]) >= {"check_mode", "diff_mode"}
    assert all(a["support"] in ("full", "partial", "none") for a in doc["attributes"].values())
    assert yaml.safe_load(module.EXAMPLES)
    for key, ret in yaml.safe_load(module.RETURN).items():
        assert {"description", "type", "returned"} <= set(ret), f"RETURN {key}"


@pytest.mark.parametrize("role", sorted(r for r, m in ROLE_MODULE.items() if m))
def test_the_task_passes_every_option_from_its_variable(role):
    tasks = yaml.safe_load((ROLES_DIR / role / "tasks/main.yml").read_text())
    [task] = [t for t in tasks if ROLE_MODULE[role] in t]
    passed = task[ROLE_MODULE[role]]
    assert passed == {option_name(role, var): f"{{{{ {var} }}}}" for var in role_spec(role)}
    assert task["register"] == f"__{role}"


def test_the_release_entry_point_passes_the_lock_modules_options():
    lock = load(ROLES_DIR / "sglang_probe/library/sglang_lock.py")
    [task] = yaml.safe_load((ROLES_DIR / "sglang_probe/tasks/release.yml").read_text())
    assert set(task["sglang_lock"]) == set(lock.ARGUMENT_SPEC)
    main, release = role_spec("sglang_probe"), role_spec("sglang_probe", "release")
    for var, opt in release.items():
        assert opt["type"] == main[var]["type"] and opt.get("required")
        assert any(var in passed for passed in task["sglang_lock"].values()), var


def test_the_shared_option_specs_are_the_host_plans_records():
    """What orchestrator/hostplan.py sends is what the modules accept."""
    assert set(HostPaths.model_fields) == set(host.PATHS_OPTIONS)
    assert set(LockSpec.model_fields) == set(host.LOCK_OPTIONS)
    assert set(PreflightChecks.model_fields) <= set(host.PREFLIGHT_OPTIONS)
    for name, field in PreflightChecks.model_fields.items():  # what a module requires, Python always sends
        assert field.is_required() or not host.PREFLIGHT_OPTIONS[name].get("required"), name


def _defaults(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _defaults(v)]
    if isinstance(value, list):
        return [s for v in value for s in _defaults(v)]
    return [value] if isinstance(value, str) else []


def _code_strings(path: Path) -> list[str]:
    """String constants of a module's code, its documentation strings left out."""
    tree = ast.parse(path.read_text())
    docs = {"DOCUMENTATION", "EXAMPLES", "RETURN"}
    skip = {
        id(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") in docs for t in node.targets)
    }
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
    ]


def test_no_default_or_code_repeats_a_host_path():
    found = []
    for role in ROLE_MODULE:
        found += _defaults(yaml.safe_load((ROLES_DIR / role / "defaults/main.yml").read_text()) or {})
        found += _defaults(role_spec(role))
    for path in [*MODULE_FILES, MODULE_UTILS_DIR / "orchestrator_host.py"]:
        found += _code_strings(path)
        if path.parent.name == "library":
            found += _defaults(yaml.safe_load(load(path).DOCUMENTATION)["options"])
    assert [s for s in found if any(p in s for p in HOST_PATHS)] == []
