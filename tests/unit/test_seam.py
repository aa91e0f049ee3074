"""The seam between Python and the playbooks: every `orch.*` / `_plan.*` name a playbook reads exists
in playvars.PlayVars / HostPlan, every field there is read, and every role variable a playbook
sets is one the role declares. Renaming or dropping a field on either side fails here, not on a
host."""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path

import yaml
from pydantic import BaseModel

from orchestrator.hosts.playvars import HostPlan, PlayVars
from orchestrator.paths import PLAYBOOKS_DIR, ROLES_DIR

PLAYBOOKS = sorted(PLAYBOOKS_DIR.glob("*.yml")) + sorted((PLAYBOOKS_DIR / "tasks").glob("*.yml"))
#: `orch.a.b` or `orch.hosts[...]`-free dotted paths; `_plan` is `orch.hosts[inventory_hostname]`.
NAME = re.compile(r"\b(orch|_plan)((?:\.[a-z_]+)+)")


def _model_of(annotation: object) -> type[BaseModel] | None:
    """The pydantic model inside an annotation (`X | None`, `dict[str, X]`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is not None:
        for arg in typing.get_args(annotation):
            found = _model_of(arg)
            if found:
                return found
    return None


def _fields(model: type[BaseModel], prefix: str) -> set[str]:
    """Every dotted field path of a model, nested models included; a dict of models (hosts) is
    entered through `_plan`, not by its keys."""
    paths = set()
    for name, info in model.model_fields.items():
        path = f"{prefix}.{name}"
        paths.add(path)
        inner = _model_of(info.annotation)
        if inner is not None and typing.get_origin(info.annotation) is not dict:
            paths |= _fields(inner, path)
    return paths


def _used() -> set[str]:
    names = set()
    for book in PLAYBOOKS:
        for root, path in NAME.findall(book.read_text()):
            names.add(("orch" if root == "orch" else "_plan") + path)
    return names


KNOWN = _fields(PlayVars, "orch") | _fields(HostPlan, "_plan")


def test_every_name_a_playbook_reads_is_a_field_of_the_plan():
    unknown = sorted(n for n in _used() if n not in KNOWN)
    assert not unknown, f"read by playbooks, not in orchestrator/hosts/playvars.py: {unknown}"


def test_every_field_of_the_plan_is_read_by_a_playbook():
    used = _used()
    # A field is read when it, or a record holding it, is passed on (`_plan.lock` carries all of it).
    unread = sorted(
        f
        for f in KNOWN - {"orch.hosts"}
        if not any(f == u or f.startswith(u + ".") for u in used)
        and not any(u.startswith(f + ".") for u in used)
    )
    assert not unread, f"fields no playbook reads (drop them, or pass them on): {unread}"


def _role_vars_set() -> dict[str, set[str]]:
    """role -> the role variables playbooks set where they import or include it."""
    found: dict[str, set[str]] = {}

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key in ("ansible.builtin.import_role", "ansible.builtin.include_role"):
                if key in node:
                    role = node[key]["name"].removeprefix("orchestrator.sglang.")
                    found.setdefault(role, set()).update((node.get("vars") or {}).keys())
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for book in PLAYBOOKS:
        walk(yaml.safe_load(book.read_text()))
    return found


def test_every_role_variable_a_playbook_sets_is_declared_by_the_role():
    problems = []
    for role, names in _role_vars_set().items():
        specs = yaml.safe_load((ROLES_DIR / role / "meta" / "argument_specs.yml").read_text())
        declared = {n for entry in specs["argument_specs"].values() for n in entry.get("options", {})}
        problems += [f"{role}: {n}" for n in sorted(names - declared)]
    assert not problems, f"set by a playbook, not in the role's argument_specs: {problems}"


def test_the_plan_serialises_to_the_one_extra_var(tmp_path: Path, monkeypatch) -> None:
    from orchestrator.hosts.playvars import for_profile, placements
    from orchestrator.profile import model as profile_mod

    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n    gpu2: {ansible_host: 10.0.0.2}\n")
    prof = profile_mod.load("cg_5tok_2node")
    hosts = {h: for_profile(prof, p.plan, p.facts) for h, p in placements(prof, inv, None).items()}
    extra = PlayVars(hosts=hosts, max_fail_percent=0).extravars()
    assert list(extra) == ["orch"]
    rank1 = extra["orch"]["hosts"]["gpu2"]
    assert rank1["facts"]["rank"] == 1 and rank1["facts"]["gpus"] == [0, 1, 2, 3]
    assert rank1["facts"]["health_url"] == "http://10.0.0.1:30000/health"  # rank 0 serves HTTP
    assert HostPlan.model_validate(rank1) == hosts["gpu2"]
