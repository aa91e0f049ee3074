"""The PostgreSQL fixtures (tests/conftest.py, tests/pg.py) that the ledger's tests run against."""

from __future__ import annotations

import socket

import psycopg
import pytest
import sqlalchemy as sa
from pg import Postgres


def _connect(url: str) -> psycopg.Connection:
    """psycopg's own connection, from a SQLAlchemy URL."""
    return psycopg.connect(sa.make_url(url).set(drivername="postgresql").render_as_string(False))


def _tables(url: str) -> set[str]:
    with _connect(url) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return {row[0] for row in rows}


@pytest.mark.parametrize("run", [1, 2])
def test_each_test_gets_a_fresh_database(postgres: Postgres, pg_url: str, run: int) -> None:
    """A table made in one test's database is in no other test's."""
    assert _tables(pg_url) == set()
    with _connect(pg_url) as conn:
        conn.execute(f"CREATE TABLE made_by_run_{run} (id integer)")
    assert _tables(pg_url) == {f"made_by_run_{run}"}
    others = postgres.psql("SELECT datname FROM pg_database WHERE datname LIKE 'test\\_%'").split()
    assert others == [sa.make_url(pg_url).database]  # the last test's was dropped


def test_sqlalchemy_reaches_the_database(pg_url: str) -> None:
    engine = sa.create_engine(pg_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE runs (id integer PRIMARY KEY)"))
            conn.execute(sa.text("INSERT INTO runs VALUES (1)"))
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM runs")).scalar_one() == 1
            assert conn.execute(sa.text("SHOW server_version_num")).scalar_one() >= "150000"
    finally:
        engine.dispose()


def test_the_read_only_role_can_select_but_not_insert(postgres: Postgres, pg_url: str) -> None:
    postgres.psql("CREATE TABLE runs (id integer); INSERT INTO runs VALUES (1)", pg_url)
    reader = postgres.readonly_url(pg_url)
    assert sa.make_url(reader).username == "reader"
    postgres.psql("CREATE TABLE later (id integer)", pg_url)  # default privileges cover it too
    with _connect(reader) as conn:
        assert conn.execute("SELECT id FROM runs").fetchall() == [(1,)]
        assert conn.execute("SELECT count(*) FROM later").fetchone() == (0,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO runs VALUES (2)")
        conn.rollback()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE mine (id integer)")


def test_the_server_listens_on_127_0_0_1_only(postgres: Postgres) -> None:
    assert postgres.psql("SHOW listen_addresses").strip() == "127.0.0.1"
    with socket.create_connection(("127.0.0.1", postgres.port), timeout=5):
        pass
    # The rest of 127/8 is loopback too, but nothing is bound there.
    with (
        pytest.raises(ConnectionRefusedError),
        socket.create_connection(("127.0.0.2", postgres.port), timeout=5),
    ):
        pass
    sockets = list(postgres.sockets.iterdir())
    assert [p.name for p in sockets if p.is_socket()] == [f".s.PGSQL.{postgres.port}"]
