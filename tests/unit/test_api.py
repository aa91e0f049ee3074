"""orchestrator.api: the public Python interface names the engine's own objects, and its example
runs as far as no host is needed."""

from __future__ import annotations

import ast
import importlib

from orchestrator import api


def test_every_name_is_the_engines_own_object() -> None:
    """A team's script and the engine call the same function: no wrapper that could drift."""
    tree = ast.parse(importlib.import_module("orchestrator.api").__loader__.get_source("orchestrator.api"))
    sources = {
        (alias.asname or alias.name): (node.module, alias.name)
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("orchestrator.")
        for alias in node.names
    }
    assert sorted(api.__all__) == sorted(sources)
    for name, (module, attr) in sources.items():
        assert getattr(api, name) is getattr(importlib.import_module(module), attr), name


def test_the_example_renders_without_a_host() -> None:
    prof = api.load("cg_5tok")
    plan = api.build(prof)
    assert "--speculative-algorithm EAGLE3" in " ".join(plan.argv)
    assert plan.unit.startswith("# Managed by orchestrator:")
    assert api.Options(serial="1").serial == "1"
    assert api.Settings(concurrency=4).concurrency == 4
