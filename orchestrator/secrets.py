"""Secrets: the API key, read on the control machine, for the host's 0600 `--config` file only."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from orchestrator.errors import InputError
from orchestrator.profile import Profile


def api_key(prof: Profile) -> str:
    """The profile's API key, read from the control machine's file or variable ("" if none).

    A key that is there but unusable is an error naming where it came from (never the key): an
    empty one would start the server with no authentication at all, and one that is not a single
    line of printable ASCII cannot travel in an `Authorization: Bearer` header.
    """
    ref = prof.api_key
    if ref is None:
        return ""
    if ref.file:
        path = Path(ref.file).expanduser()
        source = f"api_key.file: {path}"
        return _checked(_read_key_file(path, source), source)
    source = f"api_key.env: ${ref.env}"
    key = os.environ.get(ref.env or "")
    if key is None:
        raise InputError(f"{source} is not set on this machine")
    # os.environ keeps bytes that are not UTF-8 as lone surrogates (surrogateescape).
    if any("\udc80" <= ch <= "\udcff" for ch in key):
        raise InputError(f"{source} is not UTF-8 text")
    return _checked(key, source)


def _read_key_file(path: Path, source: str) -> str:
    """The file's text, refused when others on this machine can read or replace it.

    Refused rather than warned about, as ssh refuses an unprotected private key: on a shared
    control machine a key that anyone can read is already leaked, and a warning scrolls past in
    a deploy's output. The check follows symlinks and looks at what they point to: a link into a
    secrets manager's mount is the usual way to hand a key over, and such mounts often hold 0644
    files inside a directory only the owner can enter, which is not readable by others at all.
    """
    if not path.is_file():
        raise InputError(f"{source} does not exist on this machine (or is not a file)")
    target = path.resolve()
    mode = target.stat().st_mode
    if mode & stat.S_IWOTH:
        raise InputError(f"{source} can be written by any user on this machine: chmod o-w {target}")
    if mode & stat.S_IROTH and _others_can_reach(target):
        raise InputError(f"{source} can be read by any user on this machine: chmod o-r {target}")
    data = path.read_bytes()
    if b"\0" in data:
        raise InputError(f"{source} holds NUL bytes: a binary file, not a key")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{source} is not UTF-8 text: a binary file, not a key") from None


def _others_can_reach(target: Path) -> bool:
    """Whether every directory above `target` lets other users through (o+x)."""
    return all(folder.stat().st_mode & stat.S_IXOTH for folder in target.parents)


def _checked(raw: str, source: str) -> str:
    """The key without the blanks around it (an editor's final newline), or an error saying what is wrong."""
    key = raw.strip()
    if not key:
        raise InputError(f"{source} is empty: the server would start with no API key")
    if "\n" in key or "\r" in key:
        raise InputError(f"{source} holds {len(key.splitlines())} lines: the key must be one line")
    bad = next((i for i, ch in enumerate(key) if not (" " <= ch <= "~")), None)
    if bad is not None:
        what = repr(key[bad]) if not key[bad].isprintable() else "a non-ASCII character"
        raise InputError(f"{source} holds {what} at position {bad + 1}: the key must be printable ASCII")
    return key


def secret_config(prof: Profile) -> str:
    """The --config YAML holding the API key, for SGLang to read on the host ("" if none)."""
    key = api_key(prof)
    if not key:
        return ""
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    return f'api-key: "{escaped}"\n'
