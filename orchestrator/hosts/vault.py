"""Ansible Vault on the control machine: the secrets Ansible would use.

orchestrator uses them for its own reads: the inventory and its group_vars, and a vaulted API key
file. ansible-playbook gets them too.

The secrets come from where Ansible takes them, in its order:
1. `vault_identity_list` (ansible.cfg or ANSIBLE_VAULT_IDENTITY_LIST)
2. `--vault-id`
3. `--vault-password-file`
4. `vault_password_file` (ansible.cfg or ANSIBLE_VAULT_PASSWORD_FILE)
5. `--ask-vault-pass`

A password typed at a prompt (`--ask-vault-pass`, `--vault-id LABEL@prompt`) is asked once, by the
CLI. It reaches ansible-playbook only as ansible-runner's answer to its prompt, like the become
password. It is never in argv, the environment, a file or the artifacts.

A file or value that does not decrypt is one line naming it. It is an InputError, never a traceback.
For example: `group_vars/gpu/vault.yml: the vault password does not decrypt it (Decryption failed)`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import InputError
from orchestrator.hosts import ansible_config

#: Every vaulted file and `!vault` value starts with this.
HEADER = b"$ANSIBLE_VAULT;"
#: What to do when a vaulted file meets no password.
HOW_TO_GIVE = (
    "pass --ask-vault-pass, --vault-password-file FILE or --vault-id, "
    "or set ANSIBLE_VAULT_PASSWORD_FILE (or vault_password_file in ansible.cfg)"
)
#: The source of a `--vault-id` that is typed at a prompt rather than read from a file.
PROMPT_SOURCES = ("prompt", "prompt_ask_vault_pass")


@dataclass
class _CommandLine:
    """The vault options of this process's command, in the order given."""

    vault_ids: list[str] = field(default_factory=list)
    password_files: list[str] = field(default_factory=list)
    ask: bool = False
    #: vault id -> password typed for it ("default" for --ask-vault-pass and `--vault-id prompt`).
    typed: dict[str, str] = field(default_factory=dict)


_given = _CommandLine()
_secrets: list[tuple[str, Any]] | None = None


def reset() -> None:
    """Forget the command line's vault options and the secrets loaded (each test starts clean)."""
    global _given, _secrets
    _given, _secrets = _CommandLine(), None


def split_vault_id(slug: str) -> tuple[str | None, str]:
    """`LABEL@SOURCE` -> (LABEL, SOURCE); a bare `SOURCE` has no label (Ansible's CLI.split_vault_id)."""
    if "@" not in slug:
        return None, slug
    label, source = slug.split("@", 1)
    return label, source


def prompt_for(label: str | None) -> str:
    """The prompt ansible-playbook shows for a password to type: `--ask-vault-pass` gets Ansible's old
    format, `--vault-id LABEL@prompt` names its id."""
    return "Vault password: " if label is None else f"Vault password ({label}): "


def use_vault_id(slug: str, password: str = "") -> None:
    """`--vault-id [LABEL@]FILE|prompt` for every later read and play; `password` is the one typed for a
    prompt id. A file is kept absolute: ansible-playbook runs in another process that must find it."""
    global _secrets
    label, source = split_vault_id(slug)
    if source in PROMPT_SOURCES:
        _given.typed[label or default_id()] = password
        _given.vault_ids.append(f"{label}@prompt" if label else "prompt")
    else:
        path = os.path.abspath(os.path.expanduser(source))
        _given.vault_ids.append(f"{label}@{path}" if label else path)
    _secrets = None


def use_password_file(path: str) -> None:
    global _secrets
    _given.password_files.append(os.path.abspath(os.path.expanduser(path)))
    _secrets = None


def use_typed_password(password: str) -> None:
    """`--ask-vault-pass` (or ansible.cfg's ask_vault_pass): the password typed for the default id."""
    global _secrets
    _given.ask = True
    _given.typed[default_id()] = password
    _secrets = None


def use_configured_prompt(vault_id: str, password: str) -> None:
    """The password typed for a `LABEL@prompt` of ansible.cfg's vault_identity_list (prompts_configured)."""
    global _secrets
    _given.typed[vault_id] = password
    _secrets = None


def prompts_configured() -> list[str]:
    """The labels of ansible.cfg's vault_identity_list that are typed at a prompt: the CLI asks them too,
    since ansible-playbook would wait at its prompt for them."""
    ids = ansible_config.read()["DEFAULT_VAULT_IDENTITY_LIST"].value or []
    labelled = (split_vault_id(str(slug)) for slug in ids)
    return [label or default_id() for label, source in labelled if source in PROMPT_SOURCES]


def typed(vault_id: str) -> bool:
    return vault_id in _given.typed


def play_options() -> tuple[list[str], dict[str, str]]:
    """ansible-playbook's vault arguments for the command line's options, and the answers to its password
    prompts ({prompt regex: password}, for ansible-runner). ansible.cfg's and ANSIBLE_VAULT_* settings
    reach it by themselves: it reads the same configuration."""
    args: list[str] = []
    for slug in _given.vault_ids:
        args += ["--vault-id", slug]
    for path in _given.password_files:
        args += ["--vault-password-file", path]
    if _given.ask:
        args.append("--ask-vault-pass")
    answers = {_prompt_pattern(vault_id): password for vault_id, password in _given.typed.items()}
    if _given.ask:
        answers[_prompt_pattern(None)] = _given.typed[default_id()]
    return args, answers


def _prompt_pattern(label: str | None) -> str:
    """The regex ansible-runner answers a vault prompt by (as runner.BECOME_PROMPT)."""
    return rf"^{re.escape(prompt_for(label).rstrip())}\s*$"


def secrets() -> list[tuple[str, Any]]:
    """(vault id, VaultSecret) pairs, as ansible-playbook would build them; password files are read (and
    scripts run) once per process, on first need."""
    global _secrets
    if _secrets is None:
        _secrets = _load()
    return _secrets


def default_id() -> str:
    return str(ansible_config.read()["DEFAULT_VAULT_IDENTITY"].value or "default")


def _slugs() -> Iterator[str]:
    config = ansible_config.read()
    yield from (str(s) for s in config["DEFAULT_VAULT_IDENTITY_LIST"].value or [])
    yield from _given.vault_ids
    yield from (f"{default_id()}@{p}" for p in _given.password_files)
    if config["DEFAULT_VAULT_PASSWORD_FILE"].value:
        yield f"{default_id()}@{config['DEFAULT_VAULT_PASSWORD_FILE'].value}"
    if _given.ask:
        yield f"{default_id()}@prompt"


def _load() -> list[tuple[str, Any]]:
    from ansible.errors import AnsibleError
    from ansible.parsing.dataloader import DataLoader
    from ansible.parsing.vault import VaultSecret, get_file_vault_secret

    found: list[tuple[str, Any]] = []
    for slug in dict.fromkeys(_slugs()):  # once each, in order
        label, source = split_vault_id(slug)
        vault_id = label or default_id()
        if source in PROMPT_SOURCES:
            if vault_id not in _given.typed:
                raise InputError(
                    f"vault id {vault_id!r} is typed at a prompt (vault_identity_list): "
                    f"give --vault-id {vault_id}@prompt"
                )
            found.append((vault_id, VaultSecret(_given.typed[vault_id].encode())))
            continue
        try:
            secret = get_file_vault_secret(filename=source, vault_id=label, loader=DataLoader())
            secret.load()
        except AnsibleError as exc:
            raise InputError(f"vault password file {source}: {_first_line(exc)}") from None
        found.append((vault_id, secret))
    return found


def loader() -> Any:
    """An Ansible DataLoader that decrypts vaulted files and values with `secrets()`."""
    from ansible.parsing.dataloader import DataLoader

    data_loader = DataLoader()
    found = secrets()
    if found:  # none: Ansible's own "a vault password must be specified" names the file
        data_loader.set_vault_secrets(found)
    return data_loader


def is_vaulted(data: bytes) -> bool:
    return data.lstrip().startswith(HEADER)


def decrypt(data: bytes, where: str) -> bytes:
    """A vaulted file's plaintext; `where` names it in the one-line error."""
    from ansible.errors import AnsibleError
    from ansible.parsing.vault import VaultLib

    found = secrets()
    if not found:
        raise InputError(no_password(where))
    try:
        return VaultLib(found).decrypt(data)
    except AnsibleError as exc:
        raise InputError(wrong_password(where, exc)) from None


def no_password(where: str) -> str:
    return f"{where}: vaulted, and no vault password was given: {HOW_TO_GIVE}"


def wrong_password(where: str, exc: BaseException, what: str = "it") -> str:
    reason = _first_line(exc).split(" (")[0].split(" on ")[0].rstrip(".")
    return f"{where}: the vault password does not decrypt {what} ({reason})"


def explain(exc: BaseException) -> str | None:
    """One line naming the file for an Ansible error that is a vaulted file failing to decrypt, else None."""
    from ansible.parsing.vault import AnsibleVaultError

    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, AnsibleVaultError):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return None
    where = _origin(getattr(cause, "obj", None)) or _path_in_message(str(cause)) or "a vaulted file"
    if not secrets():
        return no_password(where)
    return wrong_password(where, cause)


def check_decrypts(variables: Mapping[str, Any]) -> None:
    """Decrypt every inline `!vault` value among `variables` once: one that does not is an InputError
    naming its file, line and variable, before any play (Ansible would fail only the task using it)."""
    seen: set[int] = set()
    for name, value in _vaulted_values(variables, "", seen):
        plain(value, name)


def plain(value: Any, name: str = "") -> Any:
    """A `!vault` value's plaintext (`name` says which variable, for the error); other values as they are."""
    ciphertext = _ciphertext(value)
    if ciphertext is None:
        return value
    where = _origin(value) or "an inline !vault value"
    what = f"the !vault value of {name}" if name else "its !vault value"
    found = secrets()
    if not found:
        raise InputError(f"{where}: {what} is vaulted, and no vault password was given: {HOW_TO_GIVE}")
    from ansible.errors import AnsibleError
    from ansible.parsing.vault import VaultLib

    try:
        return VaultLib(found).decrypt(ciphertext).decode()
    except AnsibleError as exc:
        raise InputError(wrong_password(where, exc, what)) from None


def _vaulted_values(value: Any, name: str, seen: set[int]) -> Iterator[tuple[str, Any]]:
    if _ciphertext(value) is not None:
        yield name, value
    elif isinstance(value, (Mapping, list, tuple)) and id(value) not in seen:
        seen.add(id(value))  # magic variables may refer to each other
        items = value.items() if isinstance(value, Mapping) else enumerate(value)
        for key, item in items:
            yield from _vaulted_values(item, f"{name}.{key}" if name else str(key), seen)


def _ciphertext(value: Any) -> bytes | None:
    """The vault text of an inline `!vault` value (ansible-core 2.19 and later: EncryptedString; earlier:
    AnsibleVaultEncryptedUnicode), else None."""
    try:
        from ansible.parsing.vault import EncryptedString, VaultHelper
    except ImportError:  # ansible-core before 2.19
        from ansible.parsing.yaml.objects import AnsibleVaultEncryptedUnicode

        if isinstance(value, AnsibleVaultEncryptedUnicode):
            return bytes(value._ciphertext)
        return None
    if type(value) is EncryptedString:
        text = VaultHelper.get_ciphertext(value, with_tags=False)
        return str(text).encode() if text else None
    return None


def _origin(value: Any) -> str | None:
    """`path[:line]` where Ansible read `value` from, shown relative to this directory when inside it."""
    if value is None:
        return None
    path, line = None, None
    try:
        from ansible._internal._datatag._tags import Origin  # ansible-core 2.19 and later

        tag = Origin.get_tag(value)
        if tag is not None:
            path, line = tag.path, tag.line_num
    except ImportError:
        pos = getattr(value, "ansible_pos", None)  # earlier versions
        if pos:
            path, line = pos[0], pos[1]
    if not path:
        return None
    shown = display_path(str(path))
    return f"{shown}:{line}" if line and _ciphertext(value) is not None else shown


def display_path(path: str) -> str:
    """`path` relative to this directory when it lies under it (as a user types it), else absolute."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


def _path_in_message(message: str) -> str | None:
    """The file an older ansible-core names at the end of its message (`... on /path/file`,
    `... in file /path/file`)."""
    match = re.search(r"(?: on| in file| decrypt) (\S+?)\.?$", message.strip())
    return display_path(match.group(1)) if match and Path(match.group(1)).exists() else None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
