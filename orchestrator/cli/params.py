"""Number types for command-line options: plain ASCII decimal text, finite, within a range.

Click's INT and FLOAT take what Python's int() and float() take. That is more than a number as
a person writes it: `1_0` is 10, `٣` (Arabic-Indic) is 3, `nan` and `inf` are floats, and
`1e400` is inf. A click range lets nan through, as nan is neither below nor above a bound.
These types take digits 0-9 and a leading `-`; a decimal also takes a `.` and an exponent
(`1e-3`). Anything else is click's usage error (exit 2): the option, the value as written, and
what is allowed. The range shows in --help as click's own ranges do.
"""

from __future__ import annotations

import math
import re
from typing import Any

import click

from orchestrator.cli.console import shown

_WHOLE = re.compile(r"-?[0-9]+")
_DECIMAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
#: What float() reads as no finite number.
_NOT_FINITE = re.compile(r"[-+]?(nan|inf|infinity)", re.IGNORECASE)
#: Most characters of a refused value that its message repeats.
_SHOWN = 40


def _cut(text: str) -> str:
    """A value as its message shows it: control characters escaped, cut short when long."""
    return shown(text) if len(text) <= _SHOWN else f"{shown(text[:_SHOWN])}... ({len(text)} characters)"


def _quoted(text: str) -> str:
    """_cut, in quotes: for a value that is no number."""
    head = repr(shown(text[:_SHOWN]))
    return head if len(text) <= _SHOWN else f"{head}... ({len(text)} characters)"


class Integer(click.IntRange):
    """A whole number within [low, high], written in ASCII digits."""

    def __init__(self, low: int, high: int) -> None:
        super().__init__(low, high)
        self.low, self.high = low, high

    def allowed(self) -> str:
        return f"{self.low}..{self.high}"

    def read(self, text: str, where: str = "") -> int:
        """The number `text` is, or ValueError saying why not (`where`: in which list)."""
        if not _WHOLE.fullmatch(text):
            raise ValueError(
                f"{_quoted(text)}{where} is not a whole number in {self.allowed()}: give digits 0-9 only"
            )
        # More digits than the bounds have is out of range: int() never reads thousands of them.
        if len(text.lstrip("-")) > max(len(str(self.low)), len(str(self.high))):
            raise ValueError(f"{_cut(text)}{where} is not in {self.allowed()}")
        number = int(text)
        if not self.low <= number <= self.high:
            raise ValueError(f"{text}{where} is not in {self.allowed()}")
        return number

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if type(value) is int and self.low <= value <= self.high:  # a default
            return value
        try:
            return self.read(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class Decimal(click.FloatRange):
    """A finite number within [low, high] (`above`: over low, up to high), in ASCII decimal text."""

    def __init__(self, low: float, high: float, above: bool = False) -> None:
        super().__init__(low, high, min_open=above)
        self.low, self.high, self.above = low, high, above

    def allowed(self) -> str:
        return f"{self.low:g}..{self.high:g}{f' ({self.low:g} excluded)' if self.above else ''}"

    def read(self, text: str, where: str = "") -> float:
        """The number `text` is, or ValueError saying why not (`where`: in which list)."""
        if _NOT_FINITE.fullmatch(text):
            raise ValueError(f"{_quoted(text)}{where} is not in {self.allowed()}: give a finite number")
        if not _DECIMAL.fullmatch(text):
            raise ValueError(
                f"{_quoted(text)}{where} is not a number in {self.allowed()}: give digits 0-9, a '.' "
                "and an exponent such as 1e-3 only"
            )
        number = float(text)
        if number == 0 and re.search(r"[1-9]", re.split(r"[eE]", text)[0]):  # 1e-400
            raise ValueError(
                f"{_cut(text)}{where} is too small to tell from 0: give 0, or a number in {self.allowed()}"
            )
        if not self.within(number):  # 1e400 is inf
            raise ValueError(f"{_cut(text)}{where} is not in {self.allowed()}")
        return number

    def within(self, number: float) -> bool:
        above_low = number > self.low if self.above else number >= self.low
        return math.isfinite(number) and above_low and number <= self.high

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if type(value) in (int, float) and self.within(value):  # a default
            return float(value)
        try:
            return self.read(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class Levels(click.ParamType):
    """A comma list of numbers (`1,8,32`), each one read as `item` reads it, none twice."""

    def __init__(self, item: Integer | Decimal) -> None:
        self.item = item
        self.name = "N[,N...]" if isinstance(item, Integer) else "R[,R...]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple:
        if isinstance(value, tuple):
            return value
        what = "a whole number" if isinstance(self.item, Integer) else "a number"
        levels: list[float] = []
        for part in str(value).split(","):
            text = part.strip(" ")  # `1, 8` as a person writes it: ASCII spaces only
            if not text:
                self.fail(f"an empty item in {_quoted(str(value))} is not {what}", param, ctx)
            try:
                number = self.item.read(text, f" in {_quoted(str(value))}" if text != value else "")
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
            if number in levels:
                self.fail(f"{text} is given twice in {_quoted(str(value))}", param, ctx)
            levels.append(number)
        return tuple(levels)
