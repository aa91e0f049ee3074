"""Every test: the lab's tests share one worker under pytest-xdist.

The lab is one set of hosts, and its tests run one at a time, in the order tests/lab/conftest.py
gives them. With `-n 2 --dist loadgroup` (the README's test command), they run on one worker while
the other takes the unit tests. Without xdist, the mark does nothing.

`postgres` and `pg_url`: a PostgreSQL server for the ledger's tests (tests/pg.py), one per worker.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pg import Postgres, PostgresMissing

LAB = Path(__file__).parent / "lab"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks into each test's id
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if LAB in Path(item.path).parents:
            item.add_marker(pytest.mark.xdist_group("lab"))


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """This process's PostgreSQL cluster, started by the first test that asks for it."""
    try:
        pg = Postgres.start()
    except PostgresMissing as e:
        missing = str(e)
    else:
        yield pg
        pg.stop()
        return
    pytest.fail(missing, pytrace=False)  # CI installs it: a skip would hide a broken setup


@pytest.fixture
def pg_url(postgres: Postgres) -> Iterator[str]:
    """A fresh, empty database's SQLAlchemy URL; dropped after the test."""
    url = postgres.create_db()
    yield url
    postgres.drop_db(url)


@pytest.fixture(autouse=True)
def _one_ledger_per_test() -> Iterator[None]:
    """`--ledger URL` (a CliRunner's) and ledger.use() choose the ledger for the whole process: each
    test starts and ends on the default one ($ORCHESTRATOR_LEDGER, else the state directory's)."""
    yield
    store = sys.modules.get("orchestrator.ledger.store")
    if store is not None:
        store.use(None)
