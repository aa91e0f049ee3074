"""Reading and writing a host's files: a missing or unreadable file reads as None or {}, a write
is one rename, and the ensure_* helpers change only what differs (check mode aware).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any


def read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def read_json(path: str) -> dict:
    """A JSON object from `path`; {} when it is absent, unreadable or not an object."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_atomic(path: str, data: bytes, mode: int) -> None:
    """Replace `path` with `data` (file mode `mode`) in one rename: a reader sees the old
    file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def ensure_attrs(module: Any, path: str, mode: int, changed: bool = False, owner: str = "root") -> bool:
    """`path` owned by `owner`:root with `mode`; whether anything changed (check mode aware)."""
    changed = module.set_mode_if_different(path, f"{mode:04o}", changed)
    changed = module.set_owner_if_different(path, owner, changed)
    return module.set_group_if_different(path, "root", changed)


def ensure_dir(module: Any, path: str, mode: int = 0o700) -> bool:
    """`path` a root-owned directory with `mode`; whether anything changed."""
    if os.path.isdir(path):
        return ensure_attrs(module, path, mode)
    if not module.check_mode:
        os.makedirs(path, mode=mode, exist_ok=True)
        ensure_attrs(module, path, mode)  # makedirs' mode is masked by the umask
    return True


def ensure_file(module: Any, path: str, data: bytes, mode: int, owner: str = "root") -> bool:
    """`path` holding exactly `data`, owned by `owner` with `mode`; whether anything changed."""
    if read_bytes(path) == data:
        return ensure_attrs(module, path, mode, owner=owner)
    if not module.check_mode:
        write_atomic(path, data, mode)  # a new file: the module's user, root
        if owner != "root":
            ensure_attrs(module, path, mode, owner=owner)
    return True
