"""SGLang's gateway (`smg`, PyPI sglang-router 0.3.2) as a rollout sees it, and a server's own load.

One client for both sides: roles/sglang_gateway's modules import it as
`ansible.module_utils.orchestrator_gateway`, and orchestrator/gateway.py loads this same file for
the checks before a play and the clean-up after an interrupted one. Standard library only.

The worker API, as read from sglang-router 0.3.2 and pinned by tests/unit/test_gateway_smg.py:
- GET /workers -> {"workers": [{"id", "url", "is_healthy", "load", ...}], "total", ...}
- DELETE /workers/{id} -> 202: the worker leaves the list asynchronously (on a loaded CI machine it
  was still listed right after the 202); requests already routed to it run to their end.
- POST /workers {"url", "api_key"?} -> 202: listed, and healthy after its first health check.
- The `load` of a worker stays 0 while requests run through it over HTTP in 0.3.2, and a removed
  worker is no longer listed: a drain counts the server's own requests (SGLang's GET /get_load,
  one entry per DP rank, `num_reqs` running plus waiting) instead.
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


def seen(worker: dict[str, Any] | None) -> dict[str, Any]:
    """What the report shows of a worker as the gateway lists it ({} when it is not listed)."""
    if worker is None:
        return {"listed": False}
    return {"listed": True, "is_healthy": bool(worker.get("is_healthy")), "load": worker.get("load", 0)}


def remove(gateway: str, worker_url: str, key: str = "", timeout_s: float = 30.0) -> dict[str, Any] | None:
    """Take a worker out of rotation; the worker as it was listed (None: it was not listed)."""
    worker = find(workers(gateway, key), worker_url)
    if worker is None:
        return None
    url = f"{gateway.rstrip('/')}/workers/{urllib.parse.quote(str(worker['id']), safe='')}"
    status, body = _call("DELETE", url, key)
    if status not in (200, 202, 204):
        raise _refused("DELETE", url, status, body)
    deadline = time.monotonic() + timeout_s
    while find(workers(gateway, key), worker_url) is not None:
        if time.monotonic() > deadline:
            raise GatewayError(f"{gateway} still lists {worker_url} {timeout_s:.0f} s after DELETE {url}")
        time.sleep(0.2)
    return worker


def add(
    gateway: str, worker_url: str, key: str = "", worker_key: str = "", timeout_s: float = 60.0
) -> dict[str, Any]:
    """Put a worker (back) in rotation and wait until the gateway lists it healthy; the worker."""
    listed = find(workers(gateway, key), worker_url)
    if listed is None:
        url = gateway.rstrip("/") + "/workers"
        body: dict[str, Any] = {"url": worker_url}
        if worker_key:
            body["api_key"] = worker_key
        status, answer = _call("POST", url, key, body)
        if status not in (200, 201, 202):
            raise _refused("POST", url, status, answer)
    deadline = time.monotonic() + timeout_s
    while True:
        listed = find(workers(gateway, key), worker_url)
        if listed is not None and listed.get("is_healthy"):
            return listed
        if time.monotonic() > deadline:
            state = "listed but not healthy" if listed else "not listed"
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
