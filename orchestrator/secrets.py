"""Secrets: the API key, read on the control machine, for the host's 0600 `--config` file only."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.errors import InputError
from orchestrator.profile import Profile


def api_key(prof: Profile) -> str:
    """The profile's API key, read from the control machine's file or variable ("" if none)."""
    ref = prof.api_key
    if ref is None:
        return ""
    if ref.file:
        path = Path(ref.file).expanduser()
        if not path.is_file():
            raise InputError(f"api_key.file: {path} does not exist on this machine")
        return path.read_text().strip()
    key = os.environ.get(ref.env or "", "")
    if not key:
        raise InputError(f"api_key.env: ${ref.env} is not set on this machine")
    return key


def secret_config(prof: Profile) -> str:
    """The --config YAML holding the API key, for SGLang to read on the host ("" if none)."""
    key = api_key(prof)
    if not key:
        return ""
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    return f'api-key: "{escaped}"\n'
