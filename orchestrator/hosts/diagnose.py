"""One-line diagnoses of a failed SGLang start, classified from its journal and unit state.

It also diagnoses a host where becoming root failed (`become`).

The patterns are the shapes that real SGLang, Python, NCCL and systemd print. The common ones:
- A flag typo, or a flag of another version, is an argparse usage message and exit 2 within seconds.
- CUDA runs out of memory during weight load or graph capture ("Not enough memory. Please try to
  increase --mem-fraction-static"; 0.5.23: "Loaded weights leave no GPU memory for the KV cache").
- Another process holds memory on one GPU of a TP group: "The memory capacity is unbalanced".
- NCCL init with TP > 1 or several nodes hangs silently, until the watchdog kills it
  (`--watchdog-timeout`, 300 s).

The first match wins, in the order of CLASSES. So a root cause beats the noise it leaves behind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Diagnosis:
    kind: str
    summary: str
    evidence: str = ""

    def __str__(self) -> str:
        return f"{self.summary}: {self.evidence}" if self.evidence else self.summary


#: (kind, summary, pattern) in priority order.
CLASSES: list[tuple[str, str, re.Pattern[str]]] = [
    (
        "bad-flag",
        "unknown or wrong flag (argparse rejected the command line)",
        re.compile(
            r"error: (unrecognized arguments|ambiguous option|argument --\S+|"
            r"the following arguments are required)"
        ),
    ),
    (
        "path-missing",
        "model or draft model path missing",
        re.compile(
            r"(Can't load the configuration of|is not a local folder|No such file or directory: '[^']*/|"
            r"does not appear to have a file named config\.json|Repository Not Found|HFValidationError)"
        ),
    ),
    ("port-in-use", "port already in use", re.compile(r"(Address already in use|\[Errno 98\])")),
    (
        "gpu-memory-unbalanced",
        "another process holds memory on one of the server's GPUs (SGLang refuses unequal GPUs)",
        re.compile(r"The memory capacity is unbalanced"),
    ),
    (
        "cuda-oom",
        "CUDA out of memory",
        re.compile(
            r"(CUDA out of memory|OutOfMemoryError|Not enough memory\. Please try to increase|"
            r"Loaded weights leave no GPU memory for the KV cache)"
        ),
    ),
    (
        "nccl",
        "NCCL error or timeout",
        re.compile(
            r"(NCCL error|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|NCCL WARN|DistStoreError|"
            r"waiting for clients|"
            r"Watchdog caught collective operation timeout|DistNetworkError|dist init.*time(d)? ?out|"
            r"Timed out (waiting|initializing).*(process group|rank|store))",
            re.I,
        ),
    ),
    ("import-error", "Python import error", re.compile(r"(ModuleNotFoundError|ImportError|No module named)")),
]


def _evidence(lines: list[str], pattern: re.Pattern[str]) -> str:
    for line in reversed(lines):
        if pattern.search(line):
            return line.strip()[:240]
    return ""


def classify(journal: list[str], unit_state: dict[str, str] | None = None, reason: str = "") -> Diagnosis:
    """The most specific class the journal and unit state support; `unknown` with the last line otherwise."""
    for kind, summary, pattern in CLASSES:
        hit = _evidence(journal, pattern)
        if hit:
            return Diagnosis(kind, summary, hit)
    state = unit_state or {}
    if state.get("Result") == "oom-kill" or any(
        "oom-kill" in line or "Out of memory: Killed" in line for line in journal
    ):
        return Diagnosis("killed", "killed by the kernel's OOM killer", state.get("Result", ""))
    if state.get("Result") == "signal" or state.get("ExecMainCode") in ("2", "killed"):
        return Diagnosis("killed", "killed by a signal", f"signal {state.get('ExecMainStatus', '?')}")
    if reason == "timeout":
        last = next((line.strip() for line in reversed(journal) if line.strip()), "")
        return Diagnosis("unknown", "alive but never healthy before the timeout", last[:240])
    last = next((line.strip() for line in reversed(journal) if line.strip()), "")
    return Diagnosis("unknown", "unknown failure", last[:240])


#: Ansible's words when becoming root failed before the task ran (connection plugins, any method).
_BECOME_PASSWORD = re.compile(r"\b(Missing|Incorrect) (\S+) password\b")
#: sudo's words for a login it will not let become root at all (sudoers.so, after the password).
_NOT_SUDOER = re.compile(r"(is not in the sudoers file|may not run sudo on|is not allowed to execute)")


def become(result: dict[str, Any], user: str, password_given: bool) -> str | None:
    """One line, with its fix, for a task that failed at becoming root; None for any other failure.

    `user` is the login that tried (may be "": unknown); `password_given`: whether -K gave a password.
    """
    who = user or "the login user"
    found = _BECOME_PASSWORD.search(str(result.get("msg", "")))
    if found and found.group(1) == "Missing":
        how = "" if password_given else ": pass -K/--ask-become-pass"
        return f"{found.group(2)} as {who} asks for a password{how}"
    if found:
        return f"{found.group(2)} refused the become password for {who}: give -K that user's own password"
    if _NOT_SUDOER.search(str(result.get("module_stderr", ""))) and not result.get("module_stdout"):
        return f"{who} may not sudo on this host (not in sudoers): grant it sudo, or log in as a user who may"
    return None
