"""Results are read by the module each task ran, never by its display name: with every task of
every playbook and role renamed, deploy, status, logs, preflight and a failing deploy still read
the hosts right."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from labutil import GOOD, service, variant
from orchestrator.hosts import ansible_config, deploy, logs_play, preflight_play, runner, status_play
from orchestrator.paths import ROOT
from orchestrator.profile import model as profile_mod

pytestmark = pytest.mark.lab


def _rename_tasks(node: object, counter: list[int]) -> None:
    """Every task (and block) gets a new name; play names stay."""
    if isinstance(node, list):
        for item in node:
            if isinstance(item, dict) and "hosts" not in item and "name" in item:
                counter[0] += 1
                item["name"] = f"renamed task {counter[0]}"
            _rename_tasks(item, counter)
    elif isinstance(node, dict):
        for value in node.values():
            _rename_tasks(value, counter)


@pytest.fixture
def renamed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """The collection copied with every task of its playbooks and roles renamed, and the runner
    pointed at the copy."""
    top = tmp_path / "collections"
    copy = top / "ansible_collections" / "orchestrator" / "sglang"
    for part in ("playbooks", "roles", "plugins", "meta"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    books, roles = copy / "playbooks", copy / "roles"
    counter = [0]
    for path in [*books.glob("*.yml"), *books.glob("tasks/*.yml"), *roles.glob("*/tasks/*.yml")]:
        data = yaml.safe_load(path.read_text())
        _rename_tasks(data, counter)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    monkeypatch.setattr(runner, "PLAYBOOKS_DIR", books)
    # The play's collection path comes from ansible_config.
    monkeypatch.setattr(ansible_config, "collections_dir", lambda: top)
    return counter[0]


def test_renaming_every_task_changes_nothing(lab, renamed, tmp_path):
    assert renamed > 15  # every task of the playbooks and roles
    host = lab.hosts[-1]
    good = profile_mod.load(GOOD)
    opts = deploy.Options(limit=host.name, force_restart=True)

    report = deploy.deploy(good, lab.inventory, opts)
    (h,) = report.hosts
    assert h.ok and h.restarted and h.step == "record" and h.healthy_after_s, h
    pid = service(host)["MainPID"]

    again = deploy.deploy(good, lab.inventory, deploy.Options(limit=host.name))
    (h,) = again.hosts
    assert h.ok and not h.restarted and not h.changed and h.step == "probe", h
    assert service(host)["MainPID"] == pid

    (row,) = status_play.status(lab.inventory, limit=host.name)
    assert (row.profile, row.digest, row.health, row.port) == (GOOD, h.digest, 200, good.server.port)
    assert row.gpu_used_mib > 0 and row.active_state == "active" and row.main_pid == int(pid)

    batch = logs_play.read(lab.inventory, limit=host.name, lines=5)
    assert batch.lines and not batch.failures

    (pf,) = preflight_play.preflight(good, lab.inventory, host.name)
    assert pf.ok and pf.sglang_version == good.server.sglang_version, pf

    # A failure is still placed at its step, with its diagnosis, and rolled back.
    missing = profile_mod.load(variant(tmp_path, "nomodel", server={"model_path": "/data/models/none"}))
    bad = deploy.deploy(missing, lab.inventory, deploy.Options(limit=host.name))
    (h,) = bad.hosts
    assert not h.ok and h.step == "preflight", h
    assert "model path: /data/models/none does not exist" in h.diagnosis
    assert service(host)["MainPID"] == pid  # nothing was stopped
