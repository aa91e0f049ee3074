"""benchmarks/ledger_speed.py --quick, run for real: its own PostgreSQL and SQLite ledgers, the table
of timings, and two writers at once on each engine that lose no row."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "ledger_speed.py"


def test_quick_run_prints_the_table_and_loses_no_row(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=SCRIPT.parents[1],
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert re.search(r"^command +SQLite s +PostgreSQL s +ratio", out, re.M), out
    for command in ("--help (baseline)", "history", "ledger status", "ledger.bench_results(sweep_id=id)"):
        assert re.search(rf"^ *{re.escape(command)} +[\d.]+ +[\d.]+ +[\d.]+", out, re.M), (command, out)
    assert re.search(r"^ledger push SQLite -> PostgreSQL: [\d.]+ s for \d+ rows", out, re.M), out
    for engine in ("PostgreSQL", "SQLite"):
        line = re.search(rf"^{engine}: (\d+) rows written, (\d+) found, lost 0, failed writes 0", out, re.M)
        assert line, (engine, out)
        assert int(line[1]) == int(line[2]) > 0
    assert list(tmp_path.iterdir()) == []  # its ledgers and temporary files are removed
