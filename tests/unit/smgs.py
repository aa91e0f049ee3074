"""The gateways the tests run: smg 1.x (the `gateway` extra, `smg` on PATH) and sglang-router
0.3.2, the release before smg left that package, from its own venv (scripts/setup.sh --test makes it at
PREVIOUS; ORCHESTRATOR_SMG_PREVIOUS points elsewhere). Both install a program named `smg`."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

import pytest

PREVIOUS = os.environ.get("ORCHESTRATOR_SMG_PREVIOUS", "/opt/orchestrator/smg-0.3.2/bin/smg")


@dataclass(frozen=True)
class Smg:
    """One installed gateway: its program and what `smg --version` says."""

    program: str
    version: str

    @property
    def states(self) -> bool:
        """1.x lists each worker's `status` (a DELETEd one stays listed, `draining`, for a while)."""
        return not self.version.startswith("sgl-model-gateway 0.")


def _version(program: str) -> str:
    return subprocess.run([program, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()


def params() -> list:
    """pytest params, one per gateway: each skipped, naming what to install, where it is missing."""
    found = []
    for name, program in (("smg1", shutil.which("smg")), ("smg032", PREVIOUS)):
        if program and os.access(program, os.X_OK):
            found.append(pytest.param(Smg(program, _version(program)), id=name))
        else:
            why = "pip install 'orchestrator[gateway]'" if name == "smg1" else "run scripts/setup.sh --test"
            found.append(pytest.param(None, id=name, marks=pytest.mark.skip(reason=f"{name}: {why}")))
    return found
