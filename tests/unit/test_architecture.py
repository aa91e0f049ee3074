"""docs/architecture.md names every module of orchestrator/ and every layer folder: the map stays
true to the tree."""

from __future__ import annotations

import re
from pathlib import Path

from test_import_graph import LAYERS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "orchestrator"
#: Copied onto lab hosts, not modules of the control machine.
HOST_FILES = PACKAGE / "lab" / "standins" / "host"
TEXT = (ROOT / "docs" / "architecture.md").read_text()


def test_every_module_is_in_the_architecture_table() -> None:
    table = TEXT[TEXT.index("## Every module") : TEXT.index("## The tuning loop")]
    named = set(re.findall(r"`([\w/]+\.py)`", table))
    modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if not p.is_relative_to(HOST_FILES)}
    assert modules - named == set(), "add these to docs/architecture.md's 'Every module' tables"
    assert named - modules == set(), "these are named in 'Every module' but do not exist"


def test_every_layer_is_a_folder_the_page_names() -> None:
    """The layers of test_import_graph are the package's folders, and the page names each one
    before its module tables."""
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    layers = {name.split(".")[1] for name in LAYERS if name.count(".") == 1}
    assert folders <= layers, "every subpackage is a layer in test_import_graph.LAYERS"
    head = TEXT[: TEXT.index("## Every module")]
    assert {f for f in folders if f"`{f}/`" not in head} == set(), "name each layer folder as `NAME/`"


def test_no_module_shares_a_name() -> None:
    """One name per thing: no two modules of the package share a file name, and none shares one
    with the host-side module_utils, whose files a reader meets beside them."""
    names: dict[str, list[str]] = {}
    for p in PACKAGE.rglob("*.py"):
        if p.name != "__init__.py" and not p.is_relative_to(HOST_FILES):
            names.setdefault(p.name, []).append(str(p.relative_to(ROOT)))
    host_side = ROOT / "plugins" / "module_utils"
    for p in host_side.rglob("*.py"):
        if p.name != "__init__.py" and p.name in names:
            names[p.name].append(str(p.relative_to(ROOT)))
    shared = {name: where for name, where in names.items() if len(where) > 1}
    assert not shared, f"rename one of each: {shared}"
