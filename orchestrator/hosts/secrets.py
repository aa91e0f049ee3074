"""Secrets, read on the control machine: the API key, and secret environment variables.

None of them is ever in the unit, on a command line, or in the play's variables. The API key goes
into the host's 0600 `--config` file, which is handed to the server with LoadCredential=. Secret
environment variables (secret_env, service.environment_files) go into the unit's 0600
EnvironmentFile=. With a container runtime, that file is the container engine's --env-file.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

from orchestrator.errors import InputError
from orchestrator.hosts import vault
from orchestrator.profile import sglang_rules, systemd_rules
from orchestrator.profile.model import ApiKey, Profile


def api_key(prof: Profile) -> str:
    """The profile's API key, read from the control machine's file or variable ("" if none).

    A key that is there but unusable is an error naming where it came from (never the key): an
    empty one would start the server with no authentication at all, and one that is not a single
    line of printable ASCII cannot travel in an `Authorization: Bearer` header.
    """
    if prof.api_key is None:
        return ""
    return _resolve(prof.api_key, "api_key")


def _resolve(ref: ApiKey, where: str) -> str:
    """The secret a {file} or {env} reference names, checked (see api_key)."""
    if ref.file:
        path = _home_expanded(ref.file, f"{where}.file")
        source = f"{where}.file: {path}"
        return _checked(_read_key_file(path, source), source)
    source = f"{where}.env: ${ref.env}"
    key = os.environ.get(ref.env or "")
    if key is None:
        raise InputError(f"{source} is not set on this machine")
    # os.environ keeps bytes that are not UTF-8 as lone surrogates (surrogateescape).
    if any("\udc80" <= ch <= "\udcff" for ch in key):
        raise InputError(f"{source} is not UTF-8 text")
    return _checked(key, source)


def _home_expanded(written: str, where: str) -> Path:
    """The path with `~` or `~user` expanded, or an error naming the field when this machine has no
    such user (Path.expanduser raises RuntimeError there)."""
    try:
        return Path(written).expanduser()
    except RuntimeError:
        user = written[1:].split("/", 1)[0]
        who = f"no user {user!r}" if user else "no home directory for this user"
        raise InputError(f"{where}: {written!r}: this machine has {who}; give the full path") from None


def _read_key_file(path: Path, source: str) -> str:
    """The file's text, refused when others on this machine can read or replace it.

    Refused rather than warned about, as ssh refuses an unprotected private key: on a shared
    control machine a key that anyone can read is already leaked, and a warning scrolls past in
    a deploy's output. The check follows symlinks and looks at what they point to: a link into a
    secrets manager's mount is the usual way to hand a key over, and such mounts often hold 0644
    files inside a directory only the owner can enter, which is not readable by others at all.

    An Ansible Vault file is decrypted with the vault password (vault.decrypt); others may read it, as
    they may a vaulted file in the team's repository.
    """
    if not path.is_file():
        raise InputError(f"{source} does not exist on this machine (or is not a file)")
    target = path.resolve()
    mode = target.stat().st_mode
    if mode & stat.S_IWOTH:
        raise InputError(f"{source} can be written by any user on this machine: chmod o-w {target}")
    data = path.read_bytes()
    vaulted = vault.is_vaulted(data)
    if mode & stat.S_IROTH and not vaulted and _others_can_reach(target):
        raise InputError(f"{source} can be read by any user on this machine: chmod o-r {target}")
    if vaulted:
        data = vault.decrypt(data, source)
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


def secret_env_names(prof: Profile) -> list[str]:
    """Variables of this machine's environment the profile's secrets come from: kept out of the
    environment Ansible runs in (ansible-runner writes it whole into the run's artifacts)."""
    refs = [prof.api_key, *prof.secret_env.values()]
    return [ref.env for ref in refs if ref is not None and ref.env]


#: One assignment line of an environment file, as systemd's load_env_file() reads its name
#: (parse_env_file_internal()): from the first character that is not a space or tab up to the
#: first '=', less trailing spaces and tabs. It knows no `export`: `export A=1` names "export A",
#: which systemd drops.
_ASSIGNMENT = re.compile(r"^[ \t]*([^=]*?)[ \t]*=")


def _env_file_text(prof: Profile, index: int, seen: dict[str, str]) -> str:
    """service.environment_files[index], read here and checked line by line: comments, blank
    lines and NAME=value only, names systemd takes and the profile does not set elsewhere, and
    each once over all the files (`seen`: name -> where it was first; systemd keeps the last)."""
    path = _home_expanded(prof.service.environment_files[index], f"service.environment_files[{index}]")
    source = f"service.environment_files[{index}]: {path}"
    text = _read_key_file(path, source)
    taken = {*prof.env, *prof.nccl, *prof.secret_env, "CUDA_VISIBLE_DEVICES", *sglang_rules.PLAN_ENV}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith(("#", ";")):
            continue
        match = _ASSIGNMENT.match(line)
        if match is None:
            raise InputError(f"{source}: line {number} is not NAME=value")
        name = match.group(1)
        problem = systemd_rules.env_name_problem(name)
        if problem:
            hint = " (systemd reads no `export`: write NAME=value)" if name.startswith("export") else ""
            raise InputError(f"{source}: line {number}: {name!r} is {problem}{hint}")
        problem = systemd_rules.service_manager_env_problem(name)
        if problem:
            raise InputError(f"{source}: line {number}: {problem}")
        if name in taken:
            raise InputError(
                f"{source}: line {number}: {name} is also set by the profile; keep it in one place"
            )
        if name.startswith("NCCL_"):
            raise InputError(f"{source}: line {number}: set {name} under nccl:, where it is checked")
        if name in seen:
            raise InputError(
                f"{source}: line {number}: {name} is set again (first at {seen[name]}), and systemd keeps "
                "the last; keep one"
            )
        seen[name] = f"service.environment_files[{index}] line {number}"
        open_at = _unclosed(line[match.end() :])
        if open_at is not None:
            raise InputError(
                f"{source}: line {number}: {open_at}, so systemd would read the next line into {name}'s "
                "value; close it on this line"
            )
    return text if text.endswith("\n") or not text else text + "\n"


def _unclosed(value: str) -> str | None:
    """What leaves a value open at the end of its line, as systemd's parse_env_file_internal()
    reads one (env-file.c): a single quote runs to the next ', a double quote to the next " not
    escaped by a backslash, and a backslash outside quotes escapes the next character, the
    newline included. None when the value ends on its line."""
    quote, i = None, 0
    while i < len(value):
        ch = value[i]
        if quote is None and ch in "'\"":
            quote = ch
        elif ch == quote:
            quote = None
        elif ch == "\\" and quote != "'":
            if i + 1 == len(value):
                return "it ends in a backslash"
            i += 1
        i += 1
    return None if quote is None else f"a {quote} is not closed"


def _env_line(name: str, value: str) -> str:
    """NAME="value" for systemd's load_env_file(): in double quotes, backslash escapes the
    four characters \\ " ` $ and nothing else."""
    escaped = "".join(f"\\{ch}" if ch in '\\"`$' else ch for ch in value)
    return f'{name}="{escaped}"\n'


def _engine_env_line(name: str, value: str) -> str:
    """NAME=value for docker's and podman's --env-file, which take the value literally up to the
    end of the line (no quotes, no escapes): `_resolve` has made it one line of printable ASCII."""
    return f"{name}={value}\n"


def secret_env_text(prof: Profile) -> str:
    """The unit's EnvironmentFile= text: service.environment_files in order, then secret_env
    ("" when the profile has neither). For a container runtime, the engine's --env-file text
    (validation refuses service.environment_files there: they are written in systemd's syntax)."""
    if prof.runtime.container:
        secrets = prof.secret_env.items()
        return "".join(_engine_env_line(name, _resolve(ref, f"secret_env.{name}")) for name, ref in secrets)
    seen: dict[str, str] = {}
    parts = [_env_file_text(prof, i, seen) for i in range(len(prof.service.environment_files))]
    parts += [_env_line(name, _resolve(ref, f"secret_env.{name}")) for name, ref in prof.secret_env.items()]
    return "".join(parts)


def secret_bundle(prof: Profile) -> str:
    """Every secret of the profile as the JSON the deploy play reads ({config, env, api_key}: the
    API key also as itself, for the drain's /get_load and the gateway that adds the worker back);
    "" if none."""
    config, env = secret_config(prof), secret_env_text(prof)
    if not config and not env:
        return ""
    return bundle(config, env, api_key(prof) or "")


def bundle(config: str = "", env: str = "", key: str = "") -> str:
    """The JSON the plays read secrets from: the --config file, the env file, the API key. A
    rollback that only puts a drained server back in its gateway's rotation carries the key alone."""
    return json.dumps({"config": config, "env": env, "api_key": key})
