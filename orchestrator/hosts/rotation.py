"""The SGLang gateway (smg) around a deploy: checked before the play, and put right after Ctrl-C.

The per-batch steps run in the play itself, in roles/sglang_gateway and roles/sglang_drain. They are
out of rotation, drain, prove, and back in rotation. This side uses the same client, the file
plugins/module_utils/orchestrator_gateway.py, loaded here as it is shipped.
"""

from __future__ import annotations

import math
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
        found = client.find(listed[gw.url], gw.worker_url)
        if found is not None and gw.role:
            problem = _listed_role_problem(host, gw, found)
            if problem:
                problems.append(problem)
        # A PD worker smg dropped (--remove-unhealthy-workers) is added again after its restart.
        if listed[gw.url] and found is None and not gw.role:
            urls = ", ".join(str(w.get("url")) for w in listed[gw.url]) or "none"
            problems.append(
                f"{host}: {gw.worker_url} is not a worker of the gateway {gw.url} (its workers: {urls}); "
                "add it there (POST /workers), or set orchestrator_gateway_worker_url to the URL the gateway "
                "uses for this host, or run with --no-drain"
            )
    if problems:
        raise InputError("nothing was stopped: " + "; ".join(problems))


def _listed_role_problem(host: str, gw: GatewayPlan, worker: dict[str, Any]) -> str | None:
    """A PD worker the gateway lists with another role or bootstrap port than its profile's: smg
    routes by what it lists, and never checks it against the server (docs/pd.md)."""
    listed_role = client.role_of(worker)
    port = worker.get("bootstrap_port")
    if listed_role != gw.role:
        seen = f"as a {listed_role} worker"
    elif gw.role == "prefill" and port != gw.bootstrap_port:
        seen = f"with bootstrap port {port}, not {gw.bootstrap_port}"
    else:
        return None
    return (
        f"{host}: the gateway {gw.url} lists {gw.worker_url} {seen}, and its profile makes it a {gw.role} "
        f"server; run the gateway in PD mode with this worker as --{gw.role}, or remove it there "
        "(DELETE /workers/ID) and deploy again: it is added back with its role"
    )


def _add(gw: GatewayPlan, key: str, api_key: str) -> dict[str, Any]:
    """The worker back in its gateway's rotation, with its PD role and bootstrap port where it has one."""
    return client.add(
        gw.url,
        gw.worker_url,
        key,
        api_key,
        timeout_s=gw.add_timeout_s,
        role=gw.role,
        bootstrap_port=gw.bootstrap_port or None,
    )


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
            worker = _add(gw, keys.get(r.host, ""), api_key)
        except client.GatewayError as exc:
            r.gateway["left_out"] = f"the gateway did not take it back healthy: {exc}"
            continue
        r.gateway["back"] = {"changed": True, "before": {"listed": False}, "after": client.seen(worker)}


# --- a prefill/decode fleet (docs/pd.md) ---------------------------------------------------


def heal(
    reports: list[HostReport], gateways: dict[str, GatewayPlan], keys: dict[str, str], api_key: str
) -> None:
    """After a deploy: a healthy server the gateway lists `failed` (a restart outside orchestrator
    leaves it so; smg 1.13 probes it back in only after minutes at its default interval, and its
    docs call the state terminal), or a PD worker it no longer lists, goes back in rotation now.
    The play left it alone when its unit ran the plan already; the report says what was done."""
    for r in reports:
        gw = gateways.get(r.host)
        if gw is None or not r.ok or (r.gateway.get("back") or {}).get("after", {}).get("listed"):
            continue
        try:
            worker = client.find(client.workers(gw.url, keys.get(r.host, "")), gw.worker_url)
            if not (client.failed(worker) or (worker is None and gw.role)):
                continue  # in rotation, or on its way there (pending, not_ready): smg's own probes
            before = client.seen(worker)  # its status, failed, included
            back = _add(gw, keys.get(r.host, ""), api_key)
        except client.GatewayError as exc:
            r.gateway["left_out"] = f"the gateway lists it out of rotation, and did not take it back: {exc}"
            continue
        r.gateway["back"] = {"changed": True, "before": before, "after": client.seen(back), "healed": True}


def batch_size(serial: str, hosts: int) -> int:
    """Hosts per batch as Ansible's `serial` counts them: N, or P% of the play's hosts (at least 1)."""
    if serial.endswith("%"):
        return max(1, math.floor(hosts * int(serial[:-1]) / 100))
    return max(1, int(serial))


def pd_serial(
    hosts: list[str],
    drained: dict[str, GatewayPlan],
    keys: dict[str, str],
    serial: str | None,
    changing: Iterable[str],
) -> str | None:
    """The --serial a PD role's deploy rolls with behind its gateway: one host at a time when none
    was given and the role serves now; refused (InputError, before any host) when a batch would take
    every server of a role in rotation out at once, or a decode server while no prefill serves.
    Only the `changing` hosts leave the rotation: the others run their plan already."""
    restarting = set(changing)
    mine = {h: gw for h, gw in drained.items() if gw.role and h in hosts}
    if not mine:
        return serial
    listed: dict[str, list[dict]] = {}
    for h, gw in mine.items():
        if gw.url not in listed:
            listed[gw.url] = client.workers(gw.url, keys.get(h, ""))
    in_rotation = [h for h, gw in mine.items() if client.healthy(client.find(listed[gw.url], gw.worker_url))]
    if not in_rotation:
        _none_of_ours(mine, listed)
        return serial  # nothing of this role serves now: there is no rotation to keep
    order = [h for h in hosts if h in mine]
    size = batch_size(serial or "1", len(order))
    for start in range(0, len(order), size):
        batch = [h for h in order[start : start + size] if h in restarting]
        problem = _batch_problem(batch, mine, listed) if batch else None
        if problem:
            raise InputError(f"nothing was stopped: {problem}")
    return serial or "1"


def _none_of_ours(mine: dict[str, GatewayPlan], listed: dict[str, list[dict]]) -> None:
    """A role the gateway serves with workers of none of this deploy's URLs: it knows the hosts by
    other URLs, and rolling them as if none served would take them all down at once."""
    for gw in mine.values():
        serving = [
            str(w.get("url")) for w in listed[gw.url] if client.healthy(w) and client.role_of(w) == gw.role
        ]
        if serving and not any(client.find(listed[g.url], g.worker_url) for g in mine.values()):
            ours = ", ".join(g.worker_url for g in mine.values())
            raise InputError(
                f"nothing was stopped: the gateway {gw.url} serves {gw.role} with {', '.join(serving)}, and "
                f"lists none of this deploy's {gw.role} hosts ({ours}); "
                "set orchestrator_gateway_worker_url to the URL the gateway knows each host by"
            )


def _batch_problem(
    batch: list[str], mine: dict[str, GatewayPlan], listed: dict[str, list[dict]]
) -> str | None:
    url = mine[batch[0]].url
    workers = listed[url]
    leaving = {client.normalize(mine[h].worker_url) for h in batch}
    staying = [w for w in workers if client.healthy(w) and client.normalize(str(w.get("url"))) not in leaving]
    leaving_workers = [w for w in workers if client.normalize(str(w.get("url"))) in leaving]
    for r in sorted({mine[h].role for h in batch}):
        serving = [w for w in workers if client.healthy(w) and client.role_of(w) == r]
        if serving and not any(client.role_of(w) == r for w in staying):
            return (
                f"the batch {', '.join(batch)} takes every {r} server in rotation at {url} out at once; "
                f"roll with --serial 1 and two or more {r} hosts, or restart under traffic with --no-drain"
            )
    decode_out = any(client.healthy(w) and client.role_of(w) == "decode" for w in leaving_workers)
    if decode_out and not any(client.role_of(w) == "prefill" for w in staying):
        return (
            f"no prefill server is in rotation at {url}: a decode server is restarted only while a "
            "prefill server serves; deploy the prefill role first"
        )
    return None
