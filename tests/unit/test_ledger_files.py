"""A ledger file that cannot be used as it is (corrupt, a directory, newer, half-migrated, not
writable) is one line naming it and what to do, exit 2; `history` and `results` only read, so they
work on a ledger, and in a state directory, that this user may not write.

Tests run as root, which file modes do not stop, so "read-only" here is the immutable attribute
(`chattr +i`): the kernel refuses every write to such a file or folder, root's too.
"""

from __future__ import annotations

import importlib.util
import shutil
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from click.testing import CliRunner, Result

from orchestrator import ledger
from orchestrator.cli.main import cli
from orchestrator.errors import InputError
from orchestrator.ledger import schema


def _legacy() -> ModuleType:
    """tests/data/ledgers/legacy_migrations.py: ledgers as the last release before Alembic made them."""
    path = Path(__file__).parents[1] / "data" / "ledgers" / "legacy_migrations.py"
    spec = importlib.util.spec_from_file_location("legacy_migrations", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


legacy = _legacy()


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture
def immutable() -> Iterator[Callable[[Path], None]]:
    """Makes a file or folder read-only for every user, root included; undone after the test."""
    done: list[Path] = []

    def make(path: Path) -> None:
        if shutil.which("chattr") is None:
            pytest.skip("no chattr here")
        run = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
        if run.returncode != 0:
            pytest.skip(f"chattr +i is not supported here: {run.stderr.strip()}")
        done.append(path)

    yield make
    for path in reversed(done):
        subprocess.run(["chattr", "-i", str(path)], check=True)


def orch(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def results(*args: str) -> Result:
    from orchestrator.cli.bench_commands import results as command

    return CliRunner().invoke(command, list(args))


def deploy_row(host: str = "lab1") -> ledger.DeployRow:
    return ledger.DeployRow("r1", host, "sglang.service", "cg_5tok", "d1", "deploy", "healthy", True, 3.0)


def a_full_ledger() -> Path:
    """A current ledger in WAL mode with a deploy, a good unit and a bench result, as a deploy leaves it."""
    ledger.record_deploy(deploy_row(), good_unit="[Unit]\n", facts={"port": 30000})
    ledger.record_bench({"run_id": "b", "host": "lab1", "profile": "cg_5tok", "result": "ok", "tok_s": 82.5})
    return ledger.path()


def a_version_1_ledger() -> Path:
    """A ledger as the first version wrote it: rollback journal, deploys and good units, no bench."""
    db = ledger.path()
    db.parent.mkdir(parents=True)
    legacy.make_ledger(db, 1)
    old = sqlite3.connect(db)
    old.execute("PRAGMA journal_mode=DELETE")  # the first version did not use WAL
    old.execute(
        "INSERT INTO deploys (run_id, time, host, unit_name, profile, digest, action, result, restarted,"
        " duration_s) VALUES ('x', 1.0, 'lab1', 'sglang.service', 'cg_5tok', 'abc', 'deploy', 'healthy',"
        " 1, 2.0)"
    )
    old.execute("INSERT INTO good_units VALUES ('lab1', 'sglang.service', 'cg_5tok', 'abc', '[Unit]', 1.0)")
    old.commit()
    old.close()
    return db


def one_error_line(done: Result, *parts: str) -> None:
    assert done.exit_code == 2, done.output
    assert done.output.startswith("error: ") and done.output.count("\n") == 1, done.output
    assert "Traceback" not in done.output and "internal error" not in done.output
    for part in parts:
        assert part in done.output, done.output


# --- files that are not a usable ledger ----------------------------------------------------------


def _truncated(db: Path) -> None:
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(_truncated, id="truncated"),
        pytest.param(lambda db: db.write_bytes(bytes(range(256)) * 32), id="random-bytes"),
        pytest.param(lambda db: db.write_text("not a database\n"), id="text"),
    ],
)
def test_a_corrupt_ledger_is_an_error_naming_it(spoil: Callable[[Path], None]) -> None:
    for i in range(200):  # enough rows for more than a page or two, so half the file loses some
        ledger.record_bench(
            {"run_id": "b", "host": "h", "profile": f"p{i}", "result": "ok", "notes": "x" * 200}
        )
    db = ledger.path()
    spoil(db)
    for done in (orch("history"), results()):
        one_error_line(done, f"{db} is not a readable ledger", f"mv {db} {db}.broken")
    with pytest.raises(InputError, match="is not a readable ledger"):
        ledger.record_deploy(deploy_row())


def test_a_ledger_that_is_a_directory_is_an_error_naming_it() -> None:
    db = ledger.path()
    db.mkdir(parents=True)
    for done in (orch("history"), results()):
        one_error_line(done, f"{db} is a directory, not a ledger")
    with pytest.raises(InputError, match="is a directory, not a ledger"):
        ledger.record_deploy(deploy_row())


def _refused_as_newer(db: Path) -> None:
    for done in (orch("history"), results()):
        one_error_line(
            done, f"{db} has schema version 99, newer than this orchestrator knows ({schema.HEAD})"
        )
    with pytest.raises(InputError, match=r"newer than this orchestrator knows \(11\)"):
        ledger.record_deploy(deploy_row())


def test_a_ledger_of_a_newer_schema_is_refused_not_misread() -> None:
    db = a_full_ledger()
    with sqlite3.connect(db) as conn:  # as a newer orchestrator leaves it
        conn.execute("UPDATE alembic_version SET version_num='0099'")
        conn.execute("PRAGMA user_version=99")
    _refused_as_newer(db)


def test_a_ledger_of_before_alembic_with_a_newer_user_version_is_refused() -> None:
    db = ledger.path()
    db.parent.mkdir(parents=True)
    legacy.make_ledger(db, 9)
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA user_version=99")
    _refused_as_newer(db)


def test_a_ledger_whose_version_claims_a_migration_it_lacks_is_half_migrated() -> None:
    db = ledger.path()
    db.parent.mkdir(parents=True)
    legacy.make_ledger(db, 2)
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA user_version=3")
    for done in (orch("history"), results()):
        one_error_line(
            done,
            f"{db} is half-migrated (schema version 3, but good_units lacks facts; last_good lacks facts)",
        )
    with pytest.raises(InputError, match="half-migrated"):
        ledger.good_unit("lab1", "sglang.service")


def test_a_ledger_with_a_later_migration_already_in_it_is_half_migrated() -> None:
    db = ledger.path()
    db.parent.mkdir(parents=True)
    legacy.make_ledger(db, 9)
    with sqlite3.connect(db) as conn:  # migration 3's columns (and 4 to 9's), but user_version still 2
        conn.execute("PRAGMA user_version=2")
    assert ledger.history() == []  # what a version 2 ledger holds can be read
    with pytest.raises(
        InputError,
        match=r"half-migrated \(schema version 2, but migration 3 fails: duplicate column name: facts\)",
    ):
        ledger.record_deploy(deploy_row())
    with sqlite3.connect(db) as conn:  # the failed migration is undone, not left half-done again
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
        assert conn.execute("SELECT name FROM sqlite_master WHERE name='alembic_version'").fetchall() == []
        assert conn.execute("SELECT count(*) FROM deploys").fetchone()[0] == 0


# --- reading a ledger this user may not write -------------------------------------------------


def test_history_and_results_read_a_ledger_in_a_read_only_state_directory(
    state: Path, immutable: Callable[[Path], None]
) -> None:
    db = a_full_ledger()
    before = sorted(p.name for p in state.iterdir())
    immutable(db)
    immutable(state)
    shown = orch("history")
    assert shown.exit_code == 0 and "lab1" in shown.output and "healthy" in shown.output, shown.output
    listed = results("--format", "csv")
    assert listed.exit_code == 0 and "82.5" in listed.output, listed.output
    good = ledger.good_unit("lab1", "sglang.service")
    assert good is not None and good["facts"] == {"port": 30000}
    assert sorted(p.name for p in state.iterdir()) == before == ["ledger.sqlite"]
    with pytest.raises(
        InputError, match=f"{db} cannot be written .*: let this user write it and {db.parent}"
    ):
        ledger.record_deploy(deploy_row())


def test_an_old_read_only_ledger_is_read_as_it_is_not_migrated(immutable: Callable[[Path], None]) -> None:
    db = a_version_1_ledger()
    data = db.read_bytes()
    immutable(db)
    shown = orch("history", "--json")
    assert shown.exit_code == 0 and '"profile": "cg_5tok"' in shown.output, shown.output
    listed = results("--format", "json")
    assert listed.exit_code == 0 and listed.output.strip() == "[]", listed.output  # no bench before v2
    old_good = ledger.good_unit("lab1", "sglang.service", "cg_5tok")
    assert old_good is not None and old_good["facts"] == {}  # recorded before facts were kept
    assert db.read_bytes() == data
    with sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_no_ledger_in_a_read_only_state_directory_is_an_empty_history(
    state: Path, immutable: Callable[[Path], None]
) -> None:
    state.mkdir()
    immutable(state)
    shown = orch("history", "--json")
    assert shown.exit_code == 0 and shown.output.strip() == "[]", shown.output
    assert results("--format", "csv").exit_code == 0
    assert list(state.iterdir()) == []


def test_writes_not_yet_merged_into_a_read_only_ledger_are_named_not_skipped(
    state: Path, immutable: Callable[[Path], None]
) -> None:
    # A -wal file left beside the ledger (its writer was killed) that a reader cannot merge.
    src = state.parent / "live.sqlite"
    with ledger.connect(src):  # a current ledger, in WAL mode, all in the file
        pass
    live = sqlite3.connect(src)
    live.execute("PRAGMA wal_autocheckpoint=0")
    live.execute(
        "INSERT INTO deploys (run_id, time, host, unit_name, profile, digest, action, result, restarted,"
        " duration_s) VALUES ('x', 1.0, 'lab1', 'sglang.service', 'cg_5tok', 'abc', 'deploy', 'healthy',"
        " 1, 2.0)"
    )
    live.commit()
    state.mkdir()
    shutil.copy(src, state / "ledger.sqlite")
    shutil.copy(f"{src}-wal", state / "ledger.sqlite-wal")
    live.close()
    immutable(state)
    one_error_line(orch("history"), "its newest records are still in ledger.sqlite-wal")
