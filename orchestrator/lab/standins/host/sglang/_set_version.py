"""Switch the installed stand-in to another SGLang version: `python3 -m sglang._set_version 0.5.23`.

Standard library only and free of `sglang` imports, so the orchestrator can load it by path
to change a host's root filesystem from outside. What it rewrites: sglang/version.py and
the sglang-<V>.dist-info directory beside the package (importlib.metadata reads it). The
--help text of every shipped version is already in sglang/_help/.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def known_versions(package: Path) -> list[str]:
    prefix = "launch_server-help-"
    return sorted(p.name[len(prefix) : -4] for p in (package / "_help").glob(f"{prefix}*.txt"))


def metadata(version: str) -> str:
    return f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\nSummary: SGLang stand-in for the lab\n"


def set_version(package: Path, version: str) -> None:
    """Point the stand-in package at `package` to `version`; unknown versions are refused."""
    known = known_versions(package)
    if version not in known:
        raise ValueError(
            f"no --help text for SGLang {version} in {package}/_help (known: {', '.join(known)})"
        )
    (package / "version.py").write_text(f'__version__ = "{version}"\n')
    for old in package.parent.glob("sglang-*.dist-info"):
        shutil.rmtree(old)
    info = package.parent / f"sglang-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(metadata(version))
    (info / "INSTALLER").write_text("orchestrator-lab\n")
    (info / "RECORD").write_text("")
    (info / "top_level.txt").write_text("sglang\n")


if __name__ == "__main__":
    try:
        set_version(Path(__file__).resolve().parent, sys.argv[1])
    except (IndexError, ValueError) as err:
        print(f"usage: python3 -m sglang._set_version VERSION ({err})", file=sys.stderr)
        raise SystemExit(2) from None
