"""The session's lab: brought up once (or reused when one is up), taken down only if we started it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

import labutil
from orchestrator.errors import OrchestratorError
from orchestrator.lab import nspawn

#: Tests that take the lab down; they restore it, and run after every other test all the same.
DESTRUCTIVE = "lab_destructive"
#: Tests that rebuild the lab with podman: after the destructive ones, so that a lab the session
#: started is not built again as it was only to be taken down.
PODMAN = "lab_podman"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{DESTRUCTIVE}: takes the session lab down and up again; runs last")
    config.addinivalue_line(
        "markers",
        f"{PODMAN}: needs a lab with podman (the session's starts with it); runs after {DESTRUCTIVE}",
    )


@pytest.hookimpl(trylast=True)  # after -k/-m deselect: only tests that will run count below
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the destructive lab tests last, so no other test sees a lab rebuilt under its feet, and
    the podman ones after them."""
    items.sort(
        key=lambda item: (
            item.get_closest_marker(PODMAN) is not None,
            item.get_closest_marker(DESTRUCTIVE) is not None,
        )
    )
    labutil.SESSION["wants_podman"] = any(item.get_closest_marker(PODMAN) for item in items)
    labutil.SESSION["wants_docker"] = any(_engine(item) == "docker" for item in items)


def _engine(item: pytest.Item) -> str | None:
    """The engine a test of test_containers runs for (its engine_lab parameter)."""
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("engine_lab") if callspec else None


def _why_no_lab() -> str | None:
    if os.geteuid() != 0:
        return "the lab needs root"
    missing = [tool for tool in nspawn.REQUIRED_TOOLS if shutil.which(tool) is None]
    return f"the lab needs {', '.join(missing)}" if missing else None


def _podman_installable() -> bool:
    """Whether the lab this session starts carries podman: yes when podman tests will run (a
    --podman lab serves every other test too, and they then need no second base root and no
    rebuild, minutes on a fresh machine) and podman installs; they skip, saying why, otherwise."""
    if not labutil.SESSION["wants_podman"]:
        return False
    try:
        nspawn.ensure_base(podman=True)
    except OrchestratorError:
        return False
    return True


@pytest.fixture(scope="session")
def lab() -> Iterator[nspawn.LabState]:
    """The running lab: `ORCH_LAB_HOSTS` hosts (default: the lab's own, 4), with podman when podman
    tests are collected; a healthy lab of that size is reused as is. A --docker lab is refused
    (trixie hosts: the tests are of bookworm's), as one of another size is."""
    reason = _why_no_lab()
    if reason:
        pytest.skip(reason)
    wanted = int(os.environ.get("ORCH_LAB_HOSTS", nspawn.DEFAULT_HOSTS))
    if labutil.SESSION["wants_docker"]:
        labutil.docker_base()
    seen = nspawn.status()
    if seen.docker:
        pytest.fail("a --docker lab is up (trixie hosts; these tests are of bookworm's): `lab down` it first")
    if seen.healthy and len(seen.hosts) != wanted:
        pytest.fail(
            f"a lab of {len(seen.hosts)} hosts is up: `lab down` it, or set ORCH_LAB_HOSTS={len(seen.hosts)}"
        )
    reuse = seen.healthy and len(seen.hosts) == wanted
    if reuse:
        state = nspawn.up(
            hosts=wanted,
            gpus=seen.gpus or 8,
            sglang_version=seen.sglang_version or "0.5.9",
            podman=seen.podman,
        )
    else:
        state = nspawn.up(hosts=wanted, podman=_podman_installable())
    labutil.SESSION["owns_lab"] = not reuse
    yield state
    if not reuse:
        nspawn.down()
