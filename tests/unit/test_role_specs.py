"""A module option is declared once: in the module's ARGUMENT_SPEC, with its description (options
several modules take: in module_utils/orchestrator_host/options.py). scripts/role_specs.py writes what follows
from it: the DOCUMENTATION options, the doc fragment of `paths`, each role's meta/argument_specs.yml
and defaults/main.yml. Here the written files are held to it, read back as Ansible reads them
(ansible-doc, and the validator validate_argument_spec runs), and what is still written by hand is
checked: a role's tasks pass every option from its variable. Host paths come from Python only: no
default anywhere repeats one."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from orchestrator.hosts.ansible_config import collections_dir
from orchestrator.hosts.playvars import HostPaths, LockSpec, PreflightChecks
from orchestrator.paths import COLLECTION, MODULE_UTILS_DIR, MODULES_DIR, ROLES_DIR, ROOT


def _script() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("role_specs_script", ROOT / "scripts/role_specs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _script()
host = gen.host  # module_utils/orchestrator_host/options.py, as the modules import it
ROLES = sorted(p.name for p in ROLES_DIR.iterdir() if p.is_dir())
MODULE_FILES = sorted(MODULES_DIR.glob("*.py"))
HOST_PATHS = ("/etc/systemd/system", "/etc/orchestrator", "/run/orchestrator")


def role_spec(role: str, entry: str = "main") -> dict[str, dict]:
    specs = yaml.safe_load((ROLES_DIR / role / "meta/argument_specs.yml").read_text())
    return specs["argument_specs"][entry]["options"]


def entries(role: str) -> dict[str, tuple[str, dict[str, dict]]]:
    """{entry point: (module, its ARGUMENT_SPEC)} of a role."""
    return {
        entry: (module, gen.load(MODULES_DIR / f"{module}.py").ARGUMENT_SPEC)
        for entry, module in gen.entry_points(ROLES_DIR / role).items()
    }


def norm(spec: dict[str, dict]) -> dict[str, dict[str, Any]]:
    """What must agree about each option, from an ARGUMENT_SPEC, argument_specs.yml or DOCUMENTATION."""
    out = {}
    for name, opt in spec.items():
        sub = opt.get("options") or opt.get("suboptions")
        out[name] = {
            "type": opt.get("type", "str"),
            "elements": opt.get("elements"),
            "required": bool(opt.get("required", False)),
            "default": opt.get("default"),
            "choices": opt.get("choices"),
            "description": opt.get("description"),
            "options": norm(sub) if sub else None,
        }
    return out


def ansible_doc(*args: str) -> dict[str, Any]:
    """`ansible-doc --json ARGS` on the checkout's collection, as a developer runs it."""
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(collections_dir())}
    argv = [sys.executable, "-m", "ansible.cli.doc", "--json", *args]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    return json.loads(done.stdout)


def var_option(role: str, var: str) -> str:
    renamed = {v: o for o, v in gen.RENAMED.get(role, {}).items()}
    assert var in renamed or var.startswith(f"{role}_"), f"{var} lacks the role's prefix"
    return renamed.get(var, var.removeprefix(f"{role}_"))


def test_the_written_files_are_as_the_script_writes_them():
    stale = [str(p.relative_to(ROOT)) for p in gen.stale(gen.expected())]
    assert not stale, f"{', '.join(stale)}: not as {gen.COMMAND} writes them from the ARGUMENT_SPECs; run it"


def test_the_script_refuses_an_option_without_a_description_or_both_required_and_a_default():
    with pytest.raises(gen.Failed, match="option a has no description"):
        gen._check("m.py", {"a": {"type": "str", "default": ""}})
    with pytest.raises(gen.Failed, match="option a must be either required or have a default"):
        gen._check("m.py", {"a": {"type": "str", "required": True, "default": "", "description": "A."}})
    with pytest.raises(gen.Failed, match="option a must be either required or have a default"):
        gen._check("m.py", {"a": {"type": "str", "description": "A."}})


def test_ansible_doc_reads_every_module_as_its_argument_spec():
    docs = ansible_doc("-t", "module", *(f"{COLLECTION}.{p.stem}" for p in MODULE_FILES))
    docs = {name.removeprefix(f"{COLLECTION}."): doc for name, doc in docs.items()}
    assert sorted(docs) == sorted(p.stem for p in MODULE_FILES)
    for path in MODULE_FILES:
        doc, spec = docs[path.stem], gen.load(path).ARGUMENT_SPEC
        assert norm(doc["doc"]["options"]) == norm(spec), path.stem
        attributes = doc["doc"]["attributes"]
        assert set(attributes) >= {"check_mode", "diff_mode"}, path.stem
        assert all(a["support"] in ("full", "partial", "none") for a in attributes.values()), path.stem
        assert yaml.safe_load(doc["examples"]), path.stem
        for key, ret in doc["return"].items():
            assert {"description", "type", "returned"} <= set(ret), f"{path.stem}: RETURN {key}"


def _named(spec: dict[str, dict], names: dict[str, str]) -> dict[str, dict]:
    """A spec whose descriptions say I(role_variable) for I(option), as a role states them."""
    return {
        name: {
            **opt,
            "description": gen._named(opt["description"], names),
            **({"options": _named(opt["options"], names)} if "options" in opt else {}),
        }
        for name, opt in spec.items()
    }


def test_ansible_doc_reads_every_role_as_its_modules_options():
    """A role variable is its module's option with the role's prefix (gen.RENAMED aside), and a
    description's I(option) names the variable."""
    docs = ansible_doc("-t", "role", *(f"{COLLECTION}.{role}" for role in ROLES))
    docs = {name.removeprefix(f"{COLLECTION}."): doc for name, doc in docs.items()}
    for role in ROLES:
        for entry, (module, spec) in entries(role).items():
            names = {option: gen.role_var(role, option) for option in spec}
            options = docs[role]["entry_points"][entry]["options"]
            assert sorted(options) == sorted(names.values()), (role, entry)
            back = {option: options[var] for option, var in names.items()}
            assert norm(back) == norm(_named(spec, names)), (role, entry, module)
            for var, opt in options.items():  # what a module hides, the role's validation hides too
                assert opt.get("no_log", False) == spec[var_option(role, var)].get("no_log", False), var


@pytest.mark.parametrize("role", ROLES)
def test_a_role_accepts_what_its_modules_examples_pass(role):
    """With the validator validate_argument_spec runs on a role's variables at import_role."""
    for entry, (module, _) in entries(role).items():
        path = MODULES_DIR / f"{module}.py"
        for example in yaml.safe_load(gen.load(path).EXAMPLES):
            passed = example[f"{COLLECTION}.{module}"]
            given = {gen.role_var(role, option): value for option, value in passed.items()}
            result = ArgumentSpecValidator(role_spec(role, entry)).validate(given)
            assert not result.error_messages, (role, entry, example["name"])


@pytest.mark.parametrize("role", ROLES)
def test_the_task_passes_every_option_from_its_variable(role):
    for entry, (module, spec) in entries(role).items():
        tasks = yaml.safe_load((ROLES_DIR / role / "tasks" / f"{entry}.yml").read_text())
        [task] = [t for t in tasks if f"{COLLECTION}.{module}" in t]
        assert task[f"{COLLECTION}.{module}"] == {
            option: f"{{{{ {gen.role_var(role, option)} }}}}" for option in spec
        }
        if entry == "main":
            assert task["register"] == f"__{role}"


def test_the_shared_option_specs_are_the_host_plans_records():
    """What orchestrator/hosts/playvars.py sends is what the modules accept."""
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
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") in docs for t in node.targets)
    }
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
    ]


def test_no_default_or_code_repeats_a_host_path():
    found = []
    for role in ROLES:
        found += _defaults(yaml.safe_load((ROLES_DIR / role / "defaults/main.yml").read_text()) or {})
        found += _defaults(yaml.safe_load((ROLES_DIR / role / "meta/argument_specs.yml").read_text()))
    host_files = sorted((MODULE_UTILS_DIR / "orchestrator_host").glob("*.py"))
    for path in [*MODULE_FILES, *host_files, gen.FRAGMENT_FILE]:
        found += _code_strings(path)
    for path in MODULE_FILES:
        found += _defaults(yaml.safe_load(gen.load_doc(path))["options"])
    found += _defaults(yaml.safe_load(gen.load(gen.FRAGMENT_FILE).ModuleDocFragment.DOCUMENTATION))
    assert [s for s in found if any(p in s for p in HOST_PATHS)] == []
