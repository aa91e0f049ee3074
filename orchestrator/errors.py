"""One error base class; the CLI turns each into a message and an exit code."""

from __future__ import annotations

from dataclasses import dataclass


class OrchestratorError(Exception):
    """An expected failure: shown as a short message, never as a traceback."""

    exit_code = 1


class InputError(OrchestratorError):
    """The user gave something invalid (a profile, a flag, an inventory): exit 2."""

    exit_code = 2


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


def one_line(text: str) -> str:
    """Escape line breaks and control characters, which a YAML key or value may hold.

    One problem is one line: a key such as "a\\nb" must not start a line of its own.
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


class ProfileError(InputError):
    """A profile failed validation; carries every problem found, not just the first."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))
