"""One error base class; the CLI turns each into a message and an exit code."""

from __future__ import annotations

import os
from dataclasses import dataclass

from orchestrator.paths import state_dir


class OrchestratorError(Exception):
    """An expected failure: shown as a short message, never as a traceback."""

    exit_code = 1


class InputError(OrchestratorError):
    """The user gave something invalid (a profile, a flag, an inventory): exit 2."""

    exit_code = 2


class StateError(InputError):
    """The state directory, or the ledger in it, cannot be used as it is: exit 2, like bad input,
    because the fix is the user's (a path, a permission, a file to move aside), said in the message."""


def state_dir_error(why: str) -> StateError:
    """The state directory `why` (e.g. "is a file, not a directory"), and the variable that moves it."""
    if os.environ.get("ORCHESTRATOR_STATE_DIR"):
        where = "ORCHESTRATOR_STATE_DIR"
    else:
        where = "$XDG_STATE_HOME/orchestrator" if os.environ.get("XDG_STATE_HOME") else "the default"
    return StateError(
        f"state directory {short_path(state_dir())} ({where}) {why}: fix it, or point "
        "ORCHESTRATOR_STATE_DIR at a writable directory"
    )


def short_path(path: object, limit: int = 200) -> str:
    """A path for a one-line message: escaped (one_line), and cut in the middle when it is longer
    than `limit` (an $XDG_STATE_HOME of 5,000 characters must not fill the screen)."""
    text = one_line(os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else str(path))
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]}...{text[-limit // 4 :]} ({len(text)} characters)"


class Interrupted(OrchestratorError):
    """Ctrl-C (or SIGTERM) stopped a command that runs several deploys, such as a sweep: exit 130."""

    exit_code = 130


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input, located as `source: field.path: message`."""

    source: str
    loc: str
    message: str

    def __str__(self) -> str:
        where = f"{self.loc}: " if self.loc else ""
        return one_line(f"{self.source}: {where}{self.message}")


def one_line(text: str, keep: str = "") -> str:
    """Escape line breaks and control characters, which a YAML key or value may hold: ESC as
    `\\x1b`, a newline as `\\n`. Printable text, é and 中 included, stays as it is.

    The one rule for every text a user, a ledger row or a host supplied (console.shown): one
    problem is one line, since a key such as "a\\nb" must not start a line of its own, and no such
    text can drive the terminal (`\\e]0;title\\a`, `\\e[2J`). `keep` names characters left as they
    are, such as a newline in a text printed as several lines.
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch in keep else repr(ch)[1:-1] for ch in text)


class ProfileError(InputError):
    """A profile failed validation; carries every problem found, not just the first."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))
