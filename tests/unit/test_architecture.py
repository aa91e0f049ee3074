"""docs/architecture.md names every module of orchestrator/ (issue 24): the map stays true."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "orchestrator"
#: Copied onto lab hosts, not modules of the control machine.
HOST_FILES = PACKAGE / "lab" / "standins" / "host"


def test_every_module_is_in_the_architecture_table() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text[text.index("## Every module") : text.index("The tuning loop's arrows")]
    named = {n for n in re.findall(r"`([\w/]+\.py)`", table) if not n.startswith("tests/")}
    modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if not p.is_relative_to(HOST_FILES)}
    assert modules - named == set(), "add these to docs/architecture.md's 'Every module' table"
    assert named - modules == set(), "these are named in 'Every module' but do not exist"
