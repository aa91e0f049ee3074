"""No code in the orchestrator that nothing uses.

A module-level function, class, constant or method whose name appears nowhere in the
repository but at its own definition is dead: it is read, reviewed and kept working for
nothing. The check is by name, so a name shared with something live elsewhere escapes it;
it catches the plain case, cheaply.
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "orchestrator"
#: Files copied onto the lab hosts and run there: their entry points are called by the host.
HOST_FILES = PACKAGE / "lab" / "standins" / "host"
#: Where a use can be: code, and the config that names code (entry points, playbooks).
USE_SUFFIXES = {".py", ".toml", ".cfg", ".yml", ".yaml", ".j2", ".sh"}


def _repository_files() -> list[Path]:
    """Tracked and untracked files that git does not ignore (no virtualenvs, no build output)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


def _called_by_a_framework(node: ast.AST) -> bool:
    """Pydantic validators, pytest hooks and tests: used without their name being written."""
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return False
    return bool(node.decorator_list) or node.name.startswith(("test_", "pytest_", "Test"))


def _definitions(path: Path) -> list[str]:
    """Module-level names and method names (`Class.method`) defined in `path`."""
    names: list[str] = []
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if not _called_by_a_framework(node):
                names.append(node.name)
            if isinstance(node, ast.ClassDef):
                names += [
                    f"{node.name}.{sub.name}"
                    for sub in node.body
                    if isinstance(sub, ast.FunctionDef)
                    and not sub.name.startswith("__")
                    and not _called_by_a_framework(sub)
                ]
    return [n for n in names if not n.split(".")[-1].startswith("__")]


def test_every_definition_in_the_orchestrator_is_used() -> None:
    files = _repository_files()
    words = Counter(
        word
        for path in files
        if path.suffix in USE_SUFFIXES
        for word in re.findall(r"\w+", path.read_text(errors="replace"))
    )
    modules = [
        p
        for p in files
        if p.suffix == ".py" and p.is_relative_to(PACKAGE) and not p.is_relative_to(HOST_FILES)
    ]
    unused = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted(modules)
        for name in _definitions(path)
        if words[name.split(".")[-1]] <= 1
    ]
    assert not unused, "defined but never used:\n" + "\n".join(unused)
