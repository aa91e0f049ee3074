"""Bad input never crashes (issue 5): fuzzed profile files and CLI arguments exit 0 or 2.

Each example runs the real CLI through click's CliRunner and checks what a user would see:
exit 0 or 2 (1 would be a crash in `handle_errors`), no traceback, no "internal error", and,
for a rejected input, only `source: field.path: message` or `error: ...` lines. `deploy` is
fuzzed only with `--check` and an inventory that does not parse or does not exist, with
ansible-runner and the lab replaced by tripwires: it must fail before any play runs.

Examples are derandomized (the same inputs on every run, so CI is reproducible) and bounded
so the file runs in seconds; raise FUZZ_EXAMPLES locally to search longer.
"""

from __future__ import annotations

import os
import re
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from orchestrator import ledger
from orchestrator.cli.main import cli
from orchestrator.errors import InputError
from orchestrator.hosts import inventory, runner
from orchestrator.profile import model as profile_mod
from orchestrator.profile import sglang_rules

#: Scale every test's example count, e.g. FUZZ_EXAMPLES=20 for a long local search.
SCALE = int(os.environ.get("FUZZ_EXAMPLES", "1"))

FUZZ = settings(
    derandomize=True,
    database=None,
    # A generous per-example bound: an alias bomb or runaway recursion would take minutes.
    deadline=5000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _examples(n: int) -> settings:
    return settings(FUZZ, max_examples=n * SCALE)


# --- what a clean rejection looks like ----------------------------------------------

PROBLEM_RE = re.compile(r"^\S.*?: \S.*$")  # `source: field.path: message` or `source: message`


def assert_clean(result: Result, source: str | None = None) -> None:
    """Exit 0 or 2, no traceback, and every stderr line a located problem or `error: ...`."""
    shown = f"exit {result.exit_code}\n{result.output}\n{result.exception!r}"
    assert result.exit_code in (0, 2), shown
    assert "Traceback" not in result.output, shown
    assert "internal error" not in result.output, shown
    if result.exception is not None:
        assert isinstance(result.exception, SystemExit), shown
    if result.exit_code == 0:
        return
    lines = result.stderr.splitlines()
    if lines and lines[0].startswith("Usage:"):  # click's own usage error for a malformed command line
        assert any(line.startswith("Error: ") for line in lines), shown
        return
    assert lines, shown
    for line in lines:
        located = source is not None and line.startswith(f"{source}: ")
        assert line.startswith("error: ") or located or PROBLEM_RE.match(line), shown


@pytest.fixture(scope="module")
def cli_runner() -> Iterator[CliRunner]:
    """A runner whose crash logs (there should be none) land in a temporary state dir."""
    with tempfile.TemporaryDirectory() as state:
        yield CliRunner(env={"ORCHESTRATOR_STATE_DIR": state, "COLUMNS": "160"})


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


def _write(workdir: Path, content: bytes, suffix: str = ".yml") -> Path:
    fd, name = tempfile.mkstemp(suffix=suffix, dir=workdir)
    with os.fdopen(fd, "wb") as f:
        f.write(content)
    return Path(name)


def _encode(text: str) -> bytes:
    """UTF-8, but a lone surrogate stays in as its (invalid) three bytes: a broken file."""
    return text.encode("utf-8", "surrogatepass")


# --- (1) random YAML documents ----------------------------------------------------------


def _field_names(model: type[BaseModel]) -> set[str]:
    names = set(model.model_fields)
    for field in model.model_fields.values():
        for arg in (*getattr(field.annotation, "__args__", ()), field.annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                names |= _field_names(arg)
    return names


FIELD_NAMES = sorted(_field_names(profile_mod.Profile) | set(sglang_rules.KNOWN_NCCL))
SHELL = [";", "$(", ")", "`", "|", "&", ">", "<", "$HOME", "; rm -rf /", "$(reboot)", "`id`", "&& true"]
NASTY_STRINGS = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\ud800",
    "\udcff",
    "\u2028",
    "\x85",
    "\t\n\r",
    "%n%s%%",
    "{{ lookup('pipe', 'id') }}",
    "../../../etc/passwd",
    "/etc/passwd",
    "é" * 50,
    "²",  # str.isdigit() says yes, int() says no
    "١٢٣",  # Arabic-Indic digits: int() reads 123, NCCL does not
    "x" * 100_000,
    *SHELL,
    *(f"--{s}" for s in SHELL),
]

keys = st.one_of(st.sampled_from(FIELD_NAMES), st.text(max_size=20), st.integers(), st.booleans())
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([10**30, -(10**30), 2**63, 2**64 + 1, -1, 0, 65536]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(NASTY_STRINGS),
    st.sampled_from(["0.5.9", "0.5.23", "EAGLE3", "/data/m", "LL", "Ring", "sglang.service"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=12,
)


def _dump(doc: Any) -> bytes:
    return _encode(yaml.safe_dump(doc, allow_unicode=True))


@given(doc=st.dictionaries(keys, values, max_size=6))
@_examples(120)
def test_random_documents(doc: dict[Any, Any], cli_runner: CliRunner, workdir: Path) -> None:
    path = _write(workdir, _dump(doc))
    for command in ("validate", "render"):
        assert_clean(cli_runner.invoke(cli, [command, "--profile", str(path)]), str(path))


BASE, _ = profile_mod.load_raw("cg_5tok")


@st.composite
def mutated_profiles(draw: st.DrawFn) -> dict[str, Any]:
    """A valid profile with a few values replaced or added: reaches the rules, not just the schema."""
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    for _ in range(draw(st.integers(1, 3))):
        section = draw(st.sampled_from([None, *(k for k, v in doc.items() if isinstance(v, dict))]))
        target = doc if section is None else doc[section]
        key = draw(st.one_of(st.sampled_from(list(target) or ["server"]), keys))
        target[key] = draw(values)
    return doc


@given(doc=mutated_profiles())
@_examples(150)
def test_mutated_profiles(doc: dict[str, Any], cli_runner: CliRunner, workdir: Path) -> None:
    path = _write(workdir, _dump(doc))
    for command in ("validate", "render"):
        assert_clean(cli_runner.invoke(cli, [command, "--profile", str(path)]), str(path))


# --- (2) raw text: anchors, tags, encodings, garbage ------------------------------------

ALIAS_BOMB = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(8)]
    + ["server: *i"]
)
RAW_DOCS = [
    ALIAS_BOMB,
    "server: &s [*s]\n",  # an alias inside its own anchor: a self-referencing list
    "server: &s {model_path: /m, again: *s}\n",
    "base: &b {model_path: /m}\nserver:\n  <<: *b\n  tp_size: 2\n",
    "server: *undefined\n",
    "server: !!python/object/apply:os.system ['echo pwned']\n",
    "!!python/object:orchestrator.profile.model.Profile {}\n",
    "server: !custom {model_path: /m}\n",
    "server: !!binary aGVsbG8=\n",
    "server: !!set {a, b}\n",
    "server: !!timestamp 2001-12-14\n",
    "? [a, b]\n: c\n",
    "? {a: b}\n: c\n",
    "1: 2\nnull: 3\n",
    "",
    "\n\n",
    "# only a comment\n# and another\n",
    "---\n...\n",
    "---\na: 1\n---\nb: 2\n",
    "- a\n- b\n",
    "42\n",
    "'just a string'\n",
    "~\n",
    "server: {model_path: /m}\nserver: {model_path: /n}\n",
    "server:\n\tmodel_path: /m\n",
    "server: [" * 2000,
    "[" * 5000 + "]" * 5000,
    "{a: " * 3000 + "1" + "}" * 3000,
    "- " * 3000 + "x\n",
    "server: {model_path: /m}\nextends: /etc/passwd\n",
    "server: {model_path: /m}\nextends: ../../../../../../etc/passwd\n",
    "server: {model_path: /m}\nextends: /dev/null\n",
    "server: {model_path: /m}\nextends: /\n",
    "server: {model_path: /m}\nextends: ..\n",
    "server: {model_path: /m}\nextends: ../profiles\n",
    "server: {model_path: /m}\nextends: [base]\n",
    "server: {model_path: /m}\nextends: {a: b}\n",
    "server: {model_path: /m}\nextends: 'a\\0b'\n",
    "extends: base\nname: ../../etc/cron.d/x\n",
    "extends: base\nname: 'a/b'\n",
    'extends: base\nname: "\\uD800"\n',
    "extends: base\nname: 42\n",
    'extends: base\ndescription: "\\uD800\\0"\n',
    'extends: base\n"\\uD800": 1\n',
    'extends: base\nserver: {extra_args: ["--x\\0"]}\n',
    'extends: base\nenv: {"\\uD800": x}\n',
    'extends: base\nenv: {A: "\\0\\n$(id)"}\n',
    "extends: base\nnccl: {NCCL_BUFFSIZE: 100000000000000000000000000000}\n",
    'extends: base\nnccl: {NCCL_BUFFSIZE: "١٢٣"}\n',
    'extends: base\nnccl: {NCCL_BUFFSIZE: "²", NCCL_P2P_LEVEL: "٣"}\n',
    "extends: base\nserver: {port: .inf}\n",
    "extends: base\nserver: {mem_fraction_static: .nan}\n",
    "extends: base\nserver: {tp_size: 1e400}\n",
    "extends: base\nserver: {context_length: 100000000000000000000000000000000}\n",
    f"extends: ./{'x' * 300}.yml\n",  # a path component over NAME_MAX (255 bytes)
    f"extends: {'x' * 300}/base.yml\n",
    "extends: base\nserver: {tp_size: true, port: false, dp_size: 2.0}\n",
    "extends: base\nserver: {extra_args: [--api-k=sk-1, --admin-api, sk-2, --he, '--tp 4', --]}\n",
    "extends: base\nspeculative: {algorithm: EAGLE3, draft_model_path: /d, num_steps: 1e30, "
    "eagle_topk: 2, num_draft_tokens: 3}\n",
]
BOMS = [b"", b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff"]


@pytest.mark.parametrize("text", RAW_DOCS, ids=lambda t: repr(t[:30]))
def test_raw_documents(text: str, cli_runner: CliRunner, workdir: Path) -> None:
    path = _write(workdir, _encode(text))
    for command in ("validate", "render"):
        assert_clean(cli_runner.invoke(cli, [command, "--profile", str(path)]), str(path))


@given(bom=st.sampled_from(BOMS), text=st.sampled_from(RAW_DOCS), junk=st.binary(max_size=64))
@_examples(60)
def test_garbage_bytes(bom: bytes, text: str, junk: bytes, cli_runner: CliRunner, workdir: Path) -> None:
    """Byte order marks, invalid UTF-8 and random bytes around real documents."""
    for content in (bom + _encode(text), bom + junk, _encode(text) + junk, junk):
        path = _write(workdir, content)
        assert_clean(cli_runner.invoke(cli, ["render", "--profile", str(path)]), str(path))


def test_alias_bomb_is_refused(cli_runner: CliRunner, workdir: Path) -> None:
    path = _write(workdir, ALIAS_BOMB.encode())
    result = cli_runner.invoke(cli, ["validate", "--profile", str(path)])
    assert result.exit_code == 2, result.output
    assert "alias" in result.stderr


def test_large_file_without_aliases_gets_no_alias_hint(cli_runner: CliRunner, workdir: Path) -> None:
    """Issue 13: the alias hint appeared for any large file; it belongs to files with aliases."""
    big = "extends: base\nenv:\n" + "".join(f"  V{i}: x\n" for i in range(profile_mod.MAX_VALUES + 1))
    result = cli_runner.invoke(cli, ["validate", "--profile", str(_write(workdir, big.encode()))])
    assert result.exit_code == 2, result.output
    assert "has over 10000 values" in result.stderr and "alias" not in result.stderr, result.stderr
    deep = (
        "extends: base\nenv: " + "[" * (profile_mod.MAX_DEPTH + 2) + "]" * (profile_mod.MAX_DEPTH + 2) + "\n"
    )
    result = cli_runner.invoke(cli, ["validate", "--profile", str(_write(workdir, deep.encode()))])
    assert "nested more than" in result.stderr and "alias" not in result.stderr, result.stderr
    result = cli_runner.invoke(cli, ["validate", "--profile", str(_write(workdir, b"server: &s [*s]\n"))])
    assert "an alias inside its own anchor" in result.stderr, result.stderr


@pytest.mark.parametrize("ref", ["x" * 300 + ".yml", "/tmp/" + "x" * 300 + "/p.yml"])
def test_path_component_over_255_bytes_is_a_clear_error(
    ref: str, cli_runner: CliRunner, workdir: Path
) -> None:
    """Issue 13: OSError(ENAMETOOLONG) was an internal error (exit 1), from `-p` and from `extends:`."""
    result = cli_runner.invoke(cli, ["validate", "--profile", ref])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: no profile file ") and "File name too long" in result.stderr
    path = _write(workdir, f"extends: {ref if ref.startswith('/') else './' + ref}\n".encode())
    result = cli_runner.invoke(cli, ["render", "--profile", str(path)])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {path}: extends: no profile file "), result.stderr


def test_duplicate_keys_are_refused_with_their_line(cli_runner: CliRunner, workdir: Path) -> None:
    path = _write(workdir, b"extends: base\nserver: {tp_size: 4}\nserver: {tp_size: 8}\n")
    result = cli_runner.invoke(cli, ["render", "--profile", str(path)])
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {path}: not valid YAML: line 3, column 1: duplicate key 'server' (first on line 2); "
        "keep one\n"
    )


def test_python_tags_are_not_executed(cli_runner: CliRunner, workdir: Path) -> None:
    marker = workdir / "pwned"
    path = _write(workdir, f"server: !!python/object/apply:os.system ['touch {marker}']\n".encode())
    result = cli_runner.invoke(cli, ["validate", "--profile", str(path)])
    assert result.exit_code == 2 and not marker.exists()
    assert result.stderr.startswith(f"error: {path}: not valid YAML"), result.stderr


# --- (3) text that reaches the terminal: profile text, ledger rows (issue 21) ------------

#: Markup rich would read, and control sequences a terminal would obey, amid ordinary text.
HOSTILE_PIECES = [
    "[/bold]",
    "[/]",
    "[link=http://e.invalid]",
    "[red]",
    ":warning:",
    "\x1b]0;pwned\x07",
    "\x1b[2J",
    "\x1b[31m",
    "\x9b2J",
    "\x07",
    "\x08",
    "\r",
    "\n",
    "\t",
    "\x7f",
    "\u202e",
    "é",
    "中",
    " ",
    "x",
]
hostile_text = st.lists(st.one_of(st.sampled_from(HOSTILE_PIECES), st.text(max_size=5)), max_size=8).map(
    "".join
)
#: Bytes a terminal acts on: C0 controls but the line break and the tab, DEL, C1 controls.
TERMINAL_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def assert_shown_as_text(result: Result) -> None:
    """Exit 0 or 2, no traceback, and nothing in the output a terminal would obey."""
    shown = f"exit {result.exit_code}\n{result.output!r}\n{result.exception!r}"
    assert result.exit_code in (0, 2), shown
    assert "Traceback" not in result.output and "internal error" not in result.output, shown
    assert not TERMINAL_CONTROLS.search(result.output), shown


@given(text=hostile_text)
@_examples(10)
def test_profile_text_is_printed_as_text(text: str, cli_runner: CliRunner, workdir: Path) -> None:
    """A description and an env value with markup and control characters: profiles, validate and
    render --against show them escaped; the unit that render prints quotes them itself."""
    folder = Path(tempfile.mkdtemp(dir=workdir))
    path = folder / "mine.yml"
    path.write_text(yaml.safe_dump({"extends": "example:base", "description": text, "env": {"A": text}}))
    assert_shown_as_text(cli_runner.invoke(cli, ["--profiles-dir", str(folder), "profiles"]))
    assert_shown_as_text(cli_runner.invoke(cli, ["validate", "-p", str(path)]))
    assert_shown_as_text(cli_runner.invoke(cli, ["render", "-p", str(path), "--against", "example:base"]))
    unit = cli_runner.invoke(cli, ["render", "-p", str(path)])
    assert unit.exit_code in (0, 2) and "\x1b" not in unit.output and "Traceback" not in unit.output


#: Whatever a hand edit may leave in a column: SQLite keeps any value whatever the declared type.
ledger_values = st.one_of(
    st.none(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 1e15, 253402300800.0, -1.0, 0, "abc", "1e308", ""]),
    hostile_text,
    st.binary(max_size=8),
)


@pytest.fixture(scope="module")
def loose_ledger(workdir: Path) -> bytes:
    """A new ledger whose tables have lost NOT NULL, as one rebuilt by hand may have."""
    db = workdir / "loose" / "ledger.sqlite"
    with ledger.connect(db):
        pass
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=DELETE")  # one file to copy
    conn.execute("PRAGMA writable_schema=ON")
    conn.execute("UPDATE sqlite_master SET sql=replace(sql, 'NOT NULL', '') WHERE type='table'")
    conn.commit()
    conn.close()
    return db.read_bytes()


#: A row as orchestrator writes it, of each table: the fuzz changes a few of its columns.
DEPLOY_ROW = {
    "run_id": "r",
    "time": 1.8e9,
    "host": "lab1",
    "unit_name": "sglang.service",
    "profile": "cg_5tok",
    "digest": "d1",
    "action": "deploy",
    "result": "healthy",
    "restarted": 1,
    "duration_s": 3.0,
    "diagnosis": "",
}
BENCH_ROW = {
    "run_id": "r",
    "time": 1.8e9,
    "host": "lab1",
    "profile": "cg_5tok",
    "result": "ok",
    "tok_s": 80.0,
}


def _edited(row: dict[str, Any], columns: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """`row` with up to three columns set to anything (most rows shown, some skipped)."""
    return st.dictionaries(st.sampled_from(columns), ledger_values, max_size=3).map(lambda edit: row | edit)


@given(
    deploy=_edited(DEPLOY_ROW, [c for c in ledger.column_types()["deploys"] if c != "id"]),
    bench=_edited(BENCH_ROW, ledger.BENCH_COLUMNS),
)
@_examples(25)
def test_any_ledger_row_is_shown_or_skipped(
    deploy: dict[str, Any], bench: dict[str, Any], cli_runner: CliRunner, workdir: Path, loose_ledger: bytes
) -> None:
    """A row with any value in any column: history and results show it, escaped, or skip it with
    a note; never a traceback, and JSON stays JSON."""
    import json

    state = Path(tempfile.mkdtemp(dir=workdir))
    (state / "ledger.sqlite").write_bytes(loose_ledger)
    conn = sqlite3.connect(state / "ledger.sqlite")
    for table, row in (("deploys", deploy), ("bench_results", bench)):
        names = ", ".join(row)
        conn.execute(
            f"INSERT INTO {table} ({names}) VALUES ({','.join('?' * len(row))})", tuple(row.values())
        )
    conn.commit()
    conn.close()
    env = {"ORCHESTRATOR_STATE_DIR": str(state)}
    for args in (["history"], ["results"], ["results", "--format", "csv"]):
        assert_shown_as_text(cli_runner.invoke(cli, args, env=env))
    for args in (["history", "--json"], ["results", "--format", "json"]):
        done = cli_runner.invoke(cli, args, env=env)
        assert done.exit_code == 0 and "Traceback" not in done.output, done.output
        assert not TERMINAL_CONTROLS.search(done.stdout.replace("\x7f", "")), done.stdout  # JSON keeps DEL
        assert len(json.loads(done.stdout)) <= 1


# --- (4) command lines ------------------------------------------------------------------

PROFILE_REFS = [
    "",
    " ",
    "..",
    ".",
    "/",
    "./",
    "../profiles/base.yml",
    "../../../../etc/passwd",
    "/etc/passwd",
    "/etc/shadow",
    "/dev/null",
    "/dev/zero",
    "profiles",
    "profiles/",
    "profiles/base",
    "base/../base",
    "base.yml",
    "base.yaml",
    "base\x00",
    "\ud800",
    "\udcff.yml",
    "Ḱimi",
    "-p",
    "--help",
    "$(reboot)",
    "base; rm -rf /",
    "x" * 5000,
    "x" * 300 + ".yml",  # a path component over NAME_MAX (255 bytes)
    "/tmp/" + "x" * 300 + "/base.yml",
    "./" + "x" * 5000,  # a path over PATH_MAX
    "cg_5tok",
]
profile_refs = st.one_of(st.sampled_from(PROFILE_REFS), st.text(max_size=30))
flags = st.lists(st.sampled_from(["--json", "-p", "--profile", "--nope", "x", "--", "-"]), max_size=3)


@given(command=st.sampled_from(["validate", "render"]), ref=profile_refs, extra=flags)
@_examples(150)
def test_profile_argument(command: str, ref: str, extra: list[str], cli_runner: CliRunner) -> None:
    assert_clean(cli_runner.invoke(cli, [command, *extra, "--profile", ref]))


@pytest.fixture(scope="module")
def no_plays() -> Iterator[list[Any]]:
    """Tripwires: a play or a lab start during these tests is recorded (and fails the test)."""
    from orchestrator.lab import nspawn

    calls: list[Any] = []

    def tripwire(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        raise AssertionError("an Ansible play or the lab was started")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner.ansible_runner, "run", tripwire)
        mp.setattr(nspawn, "up", tripwire)
        yield calls


BAD_INVENTORIES = {
    "garbage.ini": b"\x00\xff\xfe[[[ not = an inventory\n",
    "broken.yml": b"all: [hosts, {\n",
    "hosts": b"[x\nfoo bar=\n",
    "empty.yml": b"",
}


@pytest.fixture(scope="module")
def bad_inventories(workdir: Path) -> list[Path]:
    paths = []
    for name, content in BAD_INVENTORIES.items():
        (workdir / name).write_bytes(content)
        paths.append(workdir / name)
    return [*paths, workdir / "missing.yml"]


@given(ref=profile_refs, which=st.integers(0, len(BAD_INVENTORIES)), extra=flags)
@_examples(60)
def test_deploy_check_with_bad_inventory(
    ref: str,
    which: int,
    extra: list[str],
    cli_runner: CliRunner,
    bad_inventories: list[Path],
    no_plays: list[Any],
) -> None:
    argv = ["deploy", *extra, "--profile", ref, "--check", "-i", str(bad_inventories[which])]
    result = cli_runner.invoke(cli, argv)
    assert_clean(result)
    assert result.exit_code == 2 or result.output.startswith("Usage:"), result.output  # or --help
    assert not no_plays


@pytest.mark.parametrize("command", ["deploy", "status", "stop", "verify"])
@pytest.mark.parametrize("name", list(BAD_INVENTORIES))
def test_unparsable_inventory_exits_2_before_any_play(
    command: str, name: str, cli_runner: CliRunner, bad_inventories: list[Path], no_plays: list[Any]
) -> None:
    inventory = next(p for p in bad_inventories if p.name == name)
    argv = [command, "-i", str(inventory)]
    if command in ("deploy", "verify"):
        argv += ["--profile", "cg_5tok"]
    if command == "deploy":
        argv.append("--check")
    result = cli_runner.invoke(cli, argv)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: inventory {inventory}: "), result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert not no_plays


# --- the rules the fixes enforce --------------------------------------------------------


def test_inventory_check_reports_ansibles_reason(workdir: Path) -> None:
    (workdir / "inv-garbage.ini").write_bytes(b"[x\nfoo bar=\n")
    with pytest.raises(InputError, match=r"^inventory .*inv-garbage\.ini: .*ini"):
        inventory.check(workdir / "inv-garbage.ini")
    with pytest.raises(InputError, match="does not exist"):
        inventory.check(workdir / "no-such-inventory.yml")
    (workdir / "inv-good.yml").write_text("all:\n  hosts:\n    gpu-1:\n")
    inventory.check(workdir / "inv-good.yml")


@pytest.mark.parametrize("ref", ["../../etc/no-such-file", "no/such/file", "missing.yml"])
def test_profile_with_a_path_must_exist(ref: str) -> None:
    with pytest.raises(InputError, match=re.escape(profile_mod.PATH_RULE)):
        profile_mod.resolve_path(ref)


def test_bare_profile_name_must_be_shipped() -> None:
    with pytest.raises(InputError, match=re.escape(profile_mod.PATH_RULE)):
        profile_mod.resolve_path("nope")


def test_empty_profile_argument_is_an_error(cli_runner: CliRunner) -> None:
    result = cli_runner.invoke(cli, ["validate", "--profile", ""])
    assert result.exit_code == 2 and "ok:" not in result.output, result.output


def test_profile_name_with_a_path_is_refused(cli_runner: CliRunner, workdir: Path) -> None:
    path = _write(workdir, b"extends: base\nname: ../../etc/cron.d/x\n")
    result = cli_runner.invoke(cli, ["render", "--profile", str(path)])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"{path}: name: "), result.stderr


@pytest.mark.parametrize("value", ["²", "١٢٣", str(2**63)])
def test_nccl_numbers_are_ascii_and_fit_int64(value: str, workdir: Path) -> None:
    """str.isdigit() takes '²' (int() then raised) and '١٢٣' (int() reads 123; NCCL does not)."""
    doc = {"extends": "base", "nccl": {"NCCL_BUFFSIZE": value}}
    path = _write(workdir, yaml.safe_dump(doc, allow_unicode=True).encode())
    with pytest.raises(InputError, match=r"NCCL_BUFFSIZE: (invalid value|.* is not an integer: NCCL reads)"):
        profile_mod.load(str(path))
