"""Every test: the lab's tests share one worker under pytest-xdist.

The lab is one set of hosts, and its tests run one at a time, in the order tests/lab/conftest.py
gives them. With `-n 2 --dist loadgroup` (the README's test command), they run on one worker while
the other takes the unit tests. Without xdist, the mark does nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

LAB = Path(__file__).parent / "lab"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks into each test's id
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if LAB in Path(item.path).parents:
            item.add_marker(pytest.mark.xdist_group("lab"))
