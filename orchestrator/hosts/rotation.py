"""The SGLang gateway (smg) around a deploy: checked before the play, and put right after Ctrl-C.

The per-batch steps run in the play itself, in roles/sglang_gateway and roles/sglang_drain. They are
out of rotation, drain, prove, and back in rotation. This side uses the same client, the file
plugins/module_utils/orchestrator_gateway.py, loaded here as it is shipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from orchestrator.errors import InputError
from orchestrator.hosts import inventory as inventory_mod
from orchestrator.hosts import vault
from orchestrator.hosts.host_report import HostReport
from orchestrator.hosts.playvars import GatewayPlan
from orchestrator.paths import module_utils

#: The inventory variable holding the gateway's admin API key (vault it).
KEY_VAR = "orchestrator_gateway_api_key"


client = module_utils("orchestrator_gateway")


def api_keys(inventory: Path, hosts: Iterable[str]) -> dict[str, str]:
    """Each host's gateway admin key (orchestrator_gateway_api_key, decrypted; "" when unset)."""
    names = set(hosts)
    if not names:
        return {}
    found = inventory_mod.host_variables(inventory, ",".join(sorted(names)))
    return {h: str(vault.plain(found.get(h, {}).get(KEY_VAR), KEY_VAR) or "") for h in names}


def check(gateways: dict[str, GatewayPlan], keys: dict[str, str]) -> None:
    """Before anything is stopped: every gateway answers, and lists each host's server as a worker."""
    problems: list[str] = []
    listed: dict[str, list[dict[str, Any]]] = {}
    for host, gw in gateways.items():
        if gw.url not in listed:
            try:
                listed[gw.url] = client.workers(gw.url, keys.get(host, ""))
            except client.GatewayError as exc:
                how = "does not answer" if "no answer" in str(exc) else "refused the list of workers"
                problems.append(f"{host}: its gateway (orchestrator_gateway_url) {how}: {exc}")
                listed[gw.url] = []
                continue
        if listed[gw.url] and client.find(listed[gw.url], gw.worker_url) is None:
            urls = ", ".join(str(w.get("url")) for w in listed[gw.url]) or "none"
            problems.append(
                f"{host}: {gw.worker_url} is not a worker of the gateway {gw.url} (its workers: {urls}); "
                "add it there (POST /workers), or set orchestrator_gateway_worker_url to the URL the gateway "
                "uses for this host, or run with --no-drain"
            )
    if problems:
        raise InputError("nothing was stopped: " + "; ".join(problems))


def restore(
    reports: list[HostReport], gateways: dict[str, GatewayPlan], keys: dict[str, str], api_key: str
) -> None:
    """After a deploy that failed or was interrupted (and its rollback): every worker this run took out
    and nothing put back yet goes back, unless its server was stopped and not brought back healthy;
    each report says which (`back`, or `left_out` with the reason)."""
    for r in reports:
        gw = gateways.get(r.host)
        out = r.gateway.get("out") or {}
        if (
            gw is None
            or not out.get("changed")
            or (r.gateway.get("back") or {}).get("after", {}).get("listed")
        ):
            continue
        if r.stopped and not r.rolled_back_to:
            r.gateway["left_out"] = (
                "its server was stopped and is not healthy again: deploy it, then add it back"
            )
            continue
        try:
            worker = client.add(
                gw.url, gw.worker_url, keys.get(r.host, ""), api_key, timeout_s=gw.add_timeout_s
            )
        except client.GatewayError as exc:
            r.gateway["left_out"] = f"the gateway did not take it back healthy: {exc}"
            continue
        r.gateway["back"] = {"changed": True, "before": {"listed": False}, "after": client.seen(worker)}
