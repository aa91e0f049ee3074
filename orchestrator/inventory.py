"""Reading the user's Ansible inventory with Ansible's own code: host order, addresses, variables.

Patterns (`--limit`), groups, group_vars and INI/YAML all mean what they mean to Ansible.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class InventoryHost:
    name: str
    address: str
    vars: dict[str, Any] = field(default_factory=dict)


def hosts(inventory: Path, limit: str | None = None) -> list[InventoryHost]:
    """The hosts `limit` selects, in inventory order, with their merged host and group variables."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[str(inventory)])
    if limit:
        manager.subset(limit)
    variables = VariableManager(loader=loader, inventory=manager)
    selected = []
    for host in manager.get_hosts("all"):
        merged = variables.get_vars(host=host, include_hostvars=False)
        selected.append(InventoryHost(host.name, str(merged.get("ansible_host") or host.name), dict(merged)))
    return selected


def host_names(inventory: Path, limit: str | None = None) -> list[str]:
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    manager = InventoryManager(loader=DataLoader(), sources=[str(inventory)])
    if limit:
        manager.subset(limit)
    return [host.name for host in manager.get_hosts("all")]
