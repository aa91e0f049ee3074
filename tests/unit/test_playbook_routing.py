"""The playbooks route, they do not decide (issue 24): every `when:` of playbooks/ and of the
roles' tasks is a flag, a negated flag, or a presence test of a plan field, and the decisions
themselves (end the play, restart, wait for health, drain, record, release the lock) are fields
that the host modules compute in Python: sglang_probe's decide(), sglang_gateway's `drain`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted([*ROOT.glob("playbooks/**/*.yml"), *ROOT.glob("roles/*/tasks/*.yml")])

#: A value the play was given (the plan, orchestrator's vars) or a module registered.
REF = r"(?:_plan|orch|__\w+)(?:\.\w+)*|ansible_check_mode"
DEFAULT = r"\s*\|\s*default\((?:false|true|none|''|\"\")\)"
#: Routing: a flag (maybe with a default for a task that did not run), its negation, or whether
#: a plan field is given at all.
ROUTING = re.compile(
    rf"^(?:not\s+)?(?:{REF})(?:{DEFAULT})?$"
    rf"|^not\s+\((?:{REF})(?:{DEFAULT})?\)$"
    rf"|^(?:{REF})\s+is\s+(?:not\s+)?none$"
)


def conditions(node: Any, where: str = "") -> list[tuple[str, str]]:
    """(task name, condition) for every `when:` under a parsed YAML node."""
    found = []
    if isinstance(node, dict):
        name = node.get("name", where)
        when = node.get("when")
        if when is not None:
            found += [(name, str(c)) for c in (when if isinstance(when, list) else [when])]
        for value in node.values():
            found += conditions(value, name)
    elif isinstance(node, list):
        for item in node:
            found += conditions(item, where)
    return found


def every_condition() -> list[tuple[str, str, str]]:
    return [
        (str(path.relative_to(ROOT)), name, cond)
        for path in FILES
        for name, cond in conditions(yaml.safe_load(path.read_text()))
    ]


def test_the_playbooks_have_conditions_to_check() -> None:
    found = every_condition()
    assert len(found) >= 10 and any("__sglang_probe.end_play" in c for _, _, c in found)


@pytest.mark.parametrize(("path", "task", "condition"), every_condition())
def test_a_condition_only_routes(path: str, task: str, condition: str) -> None:
    assert ROUTING.match(condition.strip()), (
        f"{path}: task {task!r}: `when: {condition}` computes a decision; compute it in the host "
        "module (sglang_probe's decide(), a result field) or in Python, and route on that field here"
    )


@pytest.mark.parametrize(
    "condition",
    [
        "__sglang_probe.restart_needed or not __sglang_probe.healthy",
        "(__sglang_probe.last_good.digest | default('')) == _plan.digest",
        "__sglang_probe.state.InvocationID | default('') | length > 0",
        "_plan.gateway is not none and __sglang_gateway.changed",
        "_plan.lock.run_id if __sglang_probe.locked else ''",
    ],
)
def test_the_decisions_that_used_to_live_in_yaml_are_refused(condition: str) -> None:
    assert not ROUTING.match(condition)


@pytest.mark.parametrize(
    "condition",
    [
        "__sglang_probe.end_play",
        "not (__sglang_record.released | default(false))",
        "_plan.gateway is not none",
    ],
)
def test_routing_is_accepted(condition: str) -> None:
    assert ROUTING.match(condition)
