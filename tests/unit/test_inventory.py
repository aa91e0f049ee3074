"""Reading inventories: Ansible's meaning (patterns, group_vars), and a cache that never goes stale."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.errors import InputError
from orchestrator.hosts import inventory


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    path = tmp_path / "inv" / "hosts.yml"
    path.parent.mkdir()
    path.write_text(
        "all:\n  children:\n    gpu:\n      hosts:\n"
        "        gpu-1: {ansible_host: 10.0.0.1}\n        gpu-2: {ansible_host: 10.0.0.2}\n"
    )
    return path


def rewrite(path: Path, text: str) -> None:
    """Write `text` in place, keeping the file's timestamps: only the content says it changed."""
    before = path.stat() if path.exists() else None
    path.write_text(text)
    if before is not None:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_hosts_addresses_and_patterns(inv: Path) -> None:
    assert inventory.hosts(inv) == [
        inventory.InventoryHost("gpu-1", "10.0.0.1"),
        inventory.InventoryHost("gpu-2", "10.0.0.2"),
    ]
    assert inventory.host_names(inv, "gpu:!gpu-1") == ["gpu-2"]
    assert inventory.host_names(inv, "nomatch") == []


def test_second_read_is_served_from_the_cache(inv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = inventory.hosts(inv, "gpu")
    monkeypatch.setattr(inventory, "_read", lambda *a: pytest.fail("parsed again, nothing changed"))
    assert inventory.hosts(inv, "gpu") == first


def test_group_vars_edit_is_seen(inv: Path) -> None:
    assert {h.deployment for h in inventory.hosts(inv)} == {None}
    (inv.parent / "group_vars").mkdir()
    rewrite(inv.parent / "group_vars" / "gpu.yml", "orchestrator_deployment: multinode\n")
    assert {h.deployment for h in inventory.hosts(inv)} == {"multinode"}
    rewrite(inv.parent / "group_vars" / "gpu.yml", "orchestrator_deployment: fleet\n")
    assert {h.deployment for h in inventory.hosts(inv)} == {"fleet"}


def test_inventory_edit_is_seen(inv: Path) -> None:
    assert inventory.host_names(inv) == ["gpu-1", "gpu-2"]
    rewrite(inv, inv.read_text().replace("gpu-2", "gpu-3"))  # same size, same mtime
    assert inventory.host_names(inv) == ["gpu-1", "gpu-3"]
    rewrite(inv, "all:\n  hosts:\n    [broken\n")
    with pytest.raises(InputError, match=r"hosts\.yml"):
        inventory.hosts(inv)


def test_dynamic_inventory_runs_every_time(tmp_path: Path) -> None:
    script = tmp_path / "dyn.sh"
    counter = tmp_path / "count"
    script.write_text(
        "#!/bin/sh\n"
        f"n=$(cat {counter} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {counter}\n"
        'echo "{\\"all\\": {\\"hosts\\": [\\"host-$n\\"]}, \\"_meta\\": {\\"hostvars\\": {}}}"\n'
    )
    script.chmod(0o755)
    first = inventory.host_names(script)
    second = inventory.host_names(script)
    assert first != second and all(n.startswith("host-") for n in first + second)


def test_unreadable_cache_is_only_a_miss(inv: Path, state: Path) -> None:
    inventory.hosts(inv)
    (state / "cache" / "inventory.json").write_text("{not json")
    assert inventory.host_names(inv) == ["gpu-1", "gpu-2"]
