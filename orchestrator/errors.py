"""One error base class; the CLI turns each into a message and an exit code."""

from __future__ import annotations

from dataclasses import dataclass


class OrchestratorError(Exception):
    """An expected failure: shown as a short message, never as a traceback."""

    exit_code = 1


class InputError(OrchestratorError):
    """The user gave something invalid (a profile, a flag, an inventory): exit 2."""

    exit_code = 2


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input, located as `source: field.path: message`."""

    source: str
    loc: str
    message: str

    def __str__(self) -> str:
        where = f"{self.loc}: " if self.loc else ""
        return f"{self.source}: {where}{self.message}"


class ProfileError(InputError):
    """A profile failed validation; carries every problem found, not just the first."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))
