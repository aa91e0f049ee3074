"""SGLang's gateway (`smg`: PyPI smg 1.x, and sglang-router 0.3.2 before it) as a rollout sees it,
and a server's own load.

One client for both sides: the modules sglang_gateway and sglang_drain import it as
`ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_gateway`, and
orchestrator/hosts/rotation.py loads this same file for the checks before a play and the clean-up after an
interrupted one. Standard library only.

The worker API, as read from both releases and pinned by tests/unit/test_gateway_smg.py (which runs
each installed one):
- GET /workers -> {"workers": [{"id", "url", "is_healthy", "load", ...}], "total", ...}; 1.x adds
  each worker's `status`: pending, ready, not_ready, failed or draining.
- DELETE /workers/{id} -> 202. 0.3.2 drops the worker from the list a moment later (on a loaded CI
  machine it was still listed right after the 202). 1.x lists it at once as `draining` (is_healthy
  false, so it is routed nothing new) until its requests have ended and a few seconds more.
  Requests already routed to it run to their end in both.
- POST /workers {"url", "api_key"?} -> 202: listed, and healthy after its first health check (1.x:
  `ready`). While 1.x still lists the URL, draining, it answers 409 (the worker exists).
- In PD mode (smg --pd-disaggregation) each worker has a `worker_type`, prefill or decode, and a
  prefill its `bootstrap_port`; POST /workers carries both. smg's docs call 1.x's `failed`
  terminal; 1.13 probes it back to `ready` after 2 good checks at its interval (60 s by default).
  A deploy deletes and adds it at once.
- The `load` of a worker stays 0 while requests run through it over HTTP in 0.3.2 (1.x counts
  them), and 0.3.2 no longer lists a removed worker: a drain counts the server's own requests
  (SGLang's GET /get_load, one entry per DP rank, `num_reqs` running plus waiting) instead.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


class GatewayError(Exception):
    """The gateway (or a server) did not answer as its API says; the message names the URL."""


def normalize(url: str) -> str:
    """A worker URL as compared: lower-case scheme and host, no trailing slash, port kept."""
    parts = urllib.parse.urlsplit(url.strip())
    return urllib.parse.urlunsplit(
        (parts.scheme.lower(), parts.netloc.lower(), parts.path.rstrip("/"), "", "")
    )


def _call(method: str, url: str, key: str = "", body: Any = None, timeout: float = 10.0) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise GatewayError(f"{method} {url}: no answer ({reason})") from None
    try:
        return status, json.loads(raw or b"null")
    except ValueError:
        return status, raw.decode(errors="replace")[:200]


def _refused(method: str, url: str, status: int, body: Any) -> GatewayError:
    if status in (401, 403):
        return GatewayError(
            f"{method} {url}: {status}: the gateway wants its admin API key: "
            "set orchestrator_gateway_api_key in the inventory (vault it)"
        )
    return GatewayError(f"{method} {url}: {status} {body}")


def workers(gateway: str, key: str = "", timeout: float = 10.0) -> list[dict[str, Any]]:
    """The gateway's workers, as GET /workers lists them."""
    url = gateway.rstrip("/") + "/workers"
    status, body = _call("GET", url, key, timeout=timeout)
    if status != 200 or not isinstance(body, dict) or not isinstance(body.get("workers"), list):
        raise _refused("GET", url, status, body)
    return body["workers"]


def find(listed: list[dict[str, Any]], worker_url: str) -> dict[str, Any] | None:
    want = normalize(worker_url)
    return next((w for w in listed if normalize(str(w.get("url", ""))) == want), None)


def healthy(worker: dict[str, Any] | None) -> bool:
    """Whether the gateway routes new requests to the worker: listed healthy and, where the gateway
    says a state (1.x), `ready` (not pending, not draining)."""
    if worker is None or not worker.get("is_healthy"):
        return False
    return worker.get("status", "ready") == "ready"


def draining(worker: dict[str, Any] | None) -> bool:
    """A worker 1.x still lists after its DELETE: out of rotation, its requests running to their end."""
    return worker is not None and worker.get("status") == "draining"


def out(worker: dict[str, Any] | None) -> bool:
    """Out of rotation: not listed, or listed draining (1.x, after its DELETE)."""
    return worker is None or draining(worker)


def seen(worker: dict[str, Any] | None) -> dict[str, Any]:
    """What the report shows of a worker as the gateway lists it ({} when it is not listed); a
    draining one (1.x, after its DELETE) is out of rotation, as one no longer listed."""
    if worker is None or draining(worker):  # out(), spelled for the type checker
        return {"listed": False}
    said = {"listed": True, "is_healthy": healthy(worker), "load": worker.get("load", 0)}
    if "status" in worker:
        said["status"] = str(worker["status"])
    return said


def remove(gateway: str, worker_url: str, key: str = "", timeout_s: float = 30.0) -> dict[str, Any] | None:
    """Take a worker out of rotation: once the gateway no longer lists it, or lists it draining
    (1.x); the worker as it was listed (None: it was not listed, or already draining)."""
    worker = find(workers(gateway, key), worker_url)
    if worker is None or draining(worker):  # out(), spelled for the type checker
        return None
    url = f"{gateway.rstrip('/')}/workers/{urllib.parse.quote(str(worker['id']), safe='')}"
    status, body = _call("DELETE", url, key)
    if status not in (200, 202, 204):
        raise _refused("DELETE", url, status, body)
    deadline = time.monotonic() + timeout_s
    while not out(find(workers(gateway, key), worker_url)):
        if time.monotonic() > deadline:
            raise GatewayError(f"{gateway} still lists {worker_url} {timeout_s:.0f} s after DELETE {url}")
        time.sleep(0.2)
    return worker


def failed(worker: dict[str, Any] | None) -> bool:
    """1.x's `failed`: terminal in smg's docs; 1.13 probes it back after 2 good checks at its
    interval. A DELETE and a new POST bring it back at once."""
    return worker is not None and worker.get("status") == "failed"


def role_of(worker: dict[str, Any]) -> str:
    """prefill, decode, or regular: a worker's role as the gateway lists it (PD mode)."""
    return str(worker.get("worker_type") or "regular").lower()


def pd_guard(listed: list[dict[str, Any]], worker_url: str, role: str) -> str | None:
    """Why taking this prefill or decode worker out now would stop the fleet serving, or None.
    A role keeps one worker in rotation, and a decode server stops only while a prefill serves."""
    me = find(listed, worker_url)
    if role not in ("prefill", "decode") or not healthy(me):
        return None  # out already, or failed: taking it out changes nothing the fleet has
    others = [w for w in listed if w is not me and healthy(w)]
    if not any(role_of(w) == role for w in others):
        return (
            f"{worker_url} is the last {role} server in rotation: taking it out stops the fleet; "
            f"restart one {role} server at a time (--serial 1) with another {role} server healthy, "
            "or restart under traffic with --no-drain"
        )
    if role == "decode" and not any(role_of(w) == "prefill" for w in others):
        return (
            f"no prefill server is in rotation: a decode server ({worker_url}) is restarted only "
            "while a prefill server serves; bring a prefill server back first"
        )
    return None


def add(
    gateway: str,
    worker_url: str,
    key: str = "",
    worker_key: str = "",
    timeout_s: float = 60.0,
    *,
    role: str = "",
    bootstrap_port: int | None = None,
) -> dict[str, Any]:
    """Put a worker (back) in rotation and wait until the gateway lists it healthy; the worker.
    A worker 1.x still lists as draining (taken out moments ago) is added once it has left the list:
    until then the gateway refuses it as one it has (409). A failed one is deleted and added again.
    A PD fleet's worker goes in with its role (`worker_type`) and a prefill's bootstrap port."""
    deadline = time.monotonic() + timeout_s
    url = gateway.rstrip("/") + "/workers"
    body: dict[str, Any] = {"url": worker_url}
    if worker_key:
        body["api_key"] = worker_key
    if role in ("prefill", "decode"):
        body["worker_type"] = role
        if role == "prefill" and bootstrap_port is not None:
            body["bootstrap_port"] = bootstrap_port
    added = False
    while True:
        listed = find(workers(gateway, key), worker_url)
        if listed is not None and healthy(listed):
            return listed
        if failed(listed):
            if added:
                raise GatewayError(f"{gateway}: {worker_url} failed its health checks after it was added")
            remove(gateway, worker_url, key, max(1.0, deadline - time.monotonic()))
            continue
        if listed is None and not added:
            status, answer = _call("POST", url, key, body)
            if status not in (200, 201, 202, 409):  # 409: a draining entry is still there; again
                raise _refused("POST", url, status, answer)
            added = status != 409
        if time.monotonic() > deadline:
            state = (
                "still draining" if draining(listed) else "listed but not healthy" if listed else "not listed"
            )
            raise GatewayError(f"{gateway}: {worker_url} is {state} {timeout_s:.0f} s after it was added")
        time.sleep(0.25)


def server_load(base_url: str, key: str = "", timeout: float = 5.0) -> int | None:
    """Requests a server is running or queueing (sum of GET /get_load's num_reqs over DP ranks);
    None when nothing answers (the server is down, so nothing is in flight there)."""
    url = base_url.rstrip("/") + "/get_load"
    try:
        status, body = _call("GET", url, key, timeout=timeout)
    except GatewayError:
        return None
    if status != 200:
        raise _refused("GET", url, status, body)
    ranks = body if isinstance(body, list) else [body]
    try:
        return sum(int(r.get("num_reqs", 0)) for r in ranks if isinstance(r, dict))
    except (TypeError, ValueError):
        raise GatewayError(f"GET {url}: not SGLang's load shape: {str(body)[:200]}") from None


def drain(base_url: str, key: str = "", timeout_s: float = 60.0, interval_s: float = 0.25) -> dict[str, Any]:
    """Wait until the server has no request left (seen twice in a row), or `timeout_s`:
    {in_flight (at the end), waited_s, timed_out}."""
    start = time.monotonic()
    quiet = 0
    while True:
        load = server_load(base_url, key)
        quiet = quiet + 1 if not load else 0
        waited = time.monotonic() - start
        if quiet >= 2:
            return {"in_flight": 0, "waited_s": round(waited, 2), "timed_out": False}
        if waited >= timeout_s:
            return {"in_flight": load or 0, "waited_s": round(waited, 2), "timed_out": True}
        time.sleep(interval_s)
