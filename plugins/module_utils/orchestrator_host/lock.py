"""The host's deploy lock (lock_dir, on tmpfs): taken atomically, taken over when expired or left by
a deploy that died, waited for, and released only by the run that holds it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import TYPE_CHECKING, Any

from .files import read_json
from .units import lock_path

if TYPE_CHECKING:  # never run: the same submodules, named as Mitogen's module finder needs them
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.files
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.units  # noqa: F401


def _stale(current: dict, mine: dict) -> bool:
    """A lock taken from our own control machine by a process that no longer runs there is
    stale: its deploy died (killed, crashed) before releasing it."""
    same_control = current.get("control") and current.get("control") == mine.get("control")
    return bool(same_control) and current.get("pid") not in (mine.get("live_pids") or [])


def try_lock(path: str, mine: dict, record: dict | None = None) -> dict | None:
    """Take the lock atomically (O_EXCL), writing `record` (default `mine`); None when taken,
    else the current holder. An expired or stale lock, or one of this same run (a rollback
    after our own Ctrl-C), is taken over."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    for _attempt in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            current = read_json(path)
            ours = current.get("run_id") == mine.get("run_id")
            if current.get("expires", 0) > time.time() and not _stale(current, mine) and not ours:
                return current
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            continue
        with os.fdopen(fd, "w") as fh:
            json.dump(record or mine, fh)
        return None
    return {"holder": "unknown (lock file keeps reappearing)"}


def acquire(module: Any, paths: dict, unit: str, lock: dict) -> None:
    """Wait up to lock's wait_s for the host's deploy lock, or fail naming who holds it."""
    now = time.time()
    mine = {**lock, "since": now, "expires": now + lock["ttl_s"]}
    record = {k: v for k, v in mine.items() if k != "live_pids"}
    deadline = time.monotonic() + lock["wait_s"]
    while True:
        holder = try_lock(lock_path(paths, unit), mine, record)
        if holder is None:
            return
        if time.monotonic() >= deadline:
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
            module.fail_json(
                msg=f"another deploy holds this host: {holder.get('holder', '?')} since {since}, "
                f"deploying {holder.get('profile') or '?'} (waited {lock['wait_s']:.0f} s)",
                lock_holder=holder,
            )
        time.sleep(0.25)


def release_if_ours(paths: dict, unit: str, run_id: str) -> bool:
    """Remove the lock if `run_id` holds it; whether it was removed."""
    path = lock_path(paths, unit)
    if not run_id or read_json(path).get("run_id") != run_id:
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
