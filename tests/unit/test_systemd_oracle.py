"""systemd itself reads the rendered unit: what it would run is exactly what the profile says.

`systemd --test --system` loads a unit as PID 1 would (the same parser, the same checks) and
dumps what it understood, without starting anything. It runs here as an unprivileged user,
so it touches nothing on this machine, over a unit directory of its own: the unit under test
and stub targets for its default dependencies.

From the dump this reads the executable, argv, environment and working directory. The only
step systemd leaves to start time is ExecStart='s `$` expansion (replace_env_argv()), which
`_expand` applies: `$$` becomes `$`, `${CREDENTIALS_DIRECTORY}` the unit's credentials directory,
and any other `$NAME` or `${NAME}` it would expand fails the test.

For generated profiles over every free-text field, either the profile is refused with located
problems, or what systemd reads equals plan.argv, plan.environment and working_directory. And
every value a systemd_rules rule refuses is one systemd refuses or changes.

The same for the [Service] settings a profile gives (service.extra's allow-list, service.limits,
service.restart_sec): refused with a located problem, or read back with no complaint and as
written, as the dump shows it; and what cannot reach the process at all (a word or variable over
MAX_ARG_STRLEN, a unit line over LONG_LINE_MAX, all of argv and environment over what execve()
takes) is refused where the kernel or systemd itself refuses it, and no earlier.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import re
import resource
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from orchestrator.errors import ProfileError
from orchestrator.hosts import secrets
from orchestrator.profile import model as profile_mod
from orchestrator.profile import systemd_rules
from orchestrator.render import container_unit, launch

SYSTEMD = Path("/lib/systemd/systemd")
UNIT = "sglang.service"
#: Empty stubs: a service's default dependencies, the unit's After=/Wants=, and rescue.target,
#: where systemd falls back when the unit has a fatal error (the dump then still shows the unit).
STUBS = ["sysinit.target", "basic.target", "shutdown.target", "network-online.target", "system.slice"]
STUBS += ["rescue.target"]
TEST_MODE = ["--test", "--system", f"--unit={UNIT}", "--no-pager"]
#: What systemd sets $CREDENTIALS_DIRECTORY to for the unit under test, a system service.
CREDENTIALS = launch.credentials_dir(UNIT)


def _prefix() -> list[str]:
    """As root, drop to nobody: systemd's test mode must not be able to change this machine."""
    if not SYSTEMD.exists():
        pytest.skip(f"{SYSTEMD} is missing: systemd is not installed here")
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv is missing: cannot run systemd's test mode as an unprivileged user")
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]


@dataclass
class Reading:
    """What systemd made of a unit."""

    load_state: str
    complaints: list[str]
    executable: str | None = None
    argv: list[str] | None = None
    environment: dict[str, str] = field(default_factory=dict)
    working_directory: str | None = None
    #: The unit's whole block of the dump, for settings read as systemd prints them.
    dump: str = ""

    def setting(self, name: str) -> list[str]:
        return re.findall(rf"^\t\t{name}: (.*)$", self.dump, re.M)


@dataclass(frozen=True)
class Systemd:
    """systemd's test mode over a unit directory of its own."""

    prefix: list[str]
    unit_dir: Path

    def read(self, unit: str) -> Reading:
        path = self.unit_dir / UNIT
        path.write_text(unit)
        path.chmod(0o644)
        result = subprocess.run(
            [*self.prefix, "env", "-i", f"SYSTEMD_UNIT_PATH={self.unit_dir}", str(SYSTEMD), *TEST_MODE],
            capture_output=True,
            cwd="/",
            timeout=60,
            check=False,
        )
        return _reading(result)


@pytest.fixture(scope="module")
def systemd() -> Iterator[Systemd]:
    prefix = _prefix()
    with tempfile.TemporaryDirectory(prefix="systemd-oracle-") as tmp:
        unit_dir = Path(tmp)
        unit_dir.chmod(0o755)
        for stub in STUBS:
            (unit_dir / stub).write_text("[Unit]\nDefaultDependencies=no\n")
            (unit_dir / stub).chmod(0o644)
        yield Systemd(prefix, unit_dir)


def _reading(result: subprocess.CompletedProcess[bytes]) -> Reading:
    """The unit's load state, complaints, executable, argv, environment and working directory."""
    err = result.stderr.decode(errors="replace")
    assert result.returncode == 0, err
    complaints = [line for line in err.splitlines() if UNIT in line]
    out = result.stdout.decode(errors="surrogateescape")
    start = out.index(f"\t-> Unit {UNIT}:\n")
    end = out.find("\n\t-> Unit ", start + 1)
    block = out[start : end if end >= 0 else len(out)]
    reading = Reading(re.search(r"^\t\tUnit Load State: (.*)$", block, re.M).group(1), complaints)
    reading.dump = block
    if reading.load_state != "loaded":
        return reading
    reading.working_directory = re.search(r"^\t\tWorkingDirectory: (.*)$", block, re.M).group(1)
    # Values are printed raw and may hold newlines: one runs up to the next `\t\tKey: ` line.
    for value in re.findall(
        r"^\t\tEnvironment: (.*?)(?=\n\t\t-> |\n\t\t[A-Z][A-Za-z]*: )", block, re.M | re.S
    ):
        name, _, val = value.partition("=")
        reading.environment[name] = val
    line = re.search(r"^\t\t-> ExecStart:\n\t\t\tCommand Line: (.*)$", block, re.M)
    if line:
        words = _command_line(line.group(1).encode(errors="surrogateescape"))
        reading.executable = words[0]
        reading.argv = [_expand(w) for w in words]
    return reading


_C_ESCAPES = {ord(k): v for k, v in zip("abfnrtv", "\a\b\f\n\r\t\v", strict=True)}


def _command_line(line: bytes) -> list[str]:
    """Undo quote_command_line() (shell_maybe_quote(), SHELL_ESCAPE_EMPTY), byte for byte."""
    words, i = [], 0
    while i < len(line):
        if line[i : i + 1] != b'"':
            j = line.find(b" ", i)
            j = len(line) if j < 0 else j
            words.append(line[i:j].decode())
            i = j + 1
            continue
        word, i = bytearray(), i + 1
        while line[i : i + 1] != b'"':
            ch = line[i]
            if ch != ord("\\"):
                word.append(ch)
                i += 1
            elif line[i + 1] in _C_ESCAPES:
                word += _C_ESCAPES[line[i + 1]].encode()
                i += 2
            elif chr(line[i + 1]).isdigit():
                word.append(int(line[i + 1 : i + 4], 8))
                i += 4
            else:
                assert line[i + 1 : i + 2] in (b"\\", b'"', b"`", b"$"), line
                word.append(line[i + 1])
                i += 2
        words.append(word.decode())
        assert line[i + 1 : i + 2] in (b"", b" "), line
        i += 2
    return words


def _expand(word: str) -> str:
    """replace_env_argv() at start: `$$` is `$`; `${CREDENTIALS_DIRECTORY}` is the unit's credentials
    directory (the API key's word, which plan means systemd to expand: whether it is the planned
    one, at Plan.credential_at, is for the caller to compare); any other expansion fails the test."""
    out, i = [], 0
    if re.match(r"\$[A-Za-z0-9_]", word):
        raise AssertionError(f"systemd would expand the word {word!r} from the environment")
    while i < len(word):
        if word.startswith("$$", i):
            out.append("$")
            i += 2
        elif word.startswith("${CREDENTIALS_DIRECTORY}", i):
            out.append(CREDENTIALS)
            i += len("${CREDENTIALS_DIRECTORY}")
        elif word.startswith("${", i):
            raise AssertionError(f"systemd would expand ${{...}} in {word!r}")
        else:
            out.append(word[i])
            i += 1
    return "".join(out)


def assert_reads_exactly(systemd: Systemd, p: launch.Plan, prof: profile_mod.Profile) -> Reading:
    reading = systemd.read(p.unit)
    assert reading.complaints == [], (reading.complaints, p.unit)
    assert reading.load_state == "loaded", p.unit
    assert reading.executable == prof.server.python, p.unit
    assert reading.argv == p.started_argv(CREDENTIALS), p.unit
    assert reading.environment == p.environment, p.unit
    assert reading.working_directory == prof.service.working_directory, p.unit
    # plan's own reading of a unit (used to compare deployed units) agrees with systemd's.
    assert launch.parse_unit(p.unit) == (p.argv, p.environment)
    started = launch.parse_unit(p.unit, {"CREDENTIALS_DIRECTORY": CREDENTIALS})
    assert started == (p.started_argv(CREDENTIALS), p.environment)
    # The compile caches' variables name the directory systemd makes (CacheDirectory=).
    made = [f"/var/cache/{d}" for d in reading.setting("CacheDirectory")]
    assert len(made) == int(prof.service.compile_cache), (made, p.unit)
    caches = set(launch.COMPILE_CACHES) - set(prof.env)
    assert {posixpath.dirname(v) for k, v in reading.environment.items() if k in caches} <= set(made), p.unit
    return reading


def _load(tmp: Path, doc: dict[str, Any], raw: bool = False) -> profile_mod.Profile:
    """`raw`: non-ASCII text written as is (PyYAML's allow_unicode), else as YAML escapes."""
    path = tmp / "p.yml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=raw))
    return profile_mod.load(str(path))


# --- the defects, one by one -----------------------------------------------------------


def test_dollar_in_environment_reaches_the_process_once(systemd: Systemd, tmp_path: Path) -> None:
    """Environment= does no `$` expansion: `$$` there reached the process as `$$`."""
    prof = _load(tmp_path, {"extends": "cg_5tok", "env": {"A": "a$HOME", "B": "$$ ${X}"}})
    p = launch.build(prof)
    assert p.environment["A"] == "a$HOME"
    assert systemd.read(p.unit).environment["A"] == "a$HOME"
    assert_reads_exactly(systemd, p, prof)


def test_dollar_in_exec_start_reaches_the_process_once(systemd: Systemd, tmp_path: Path) -> None:
    doc = {
        "extends": "cg_5tok",
        "server": {"served_model_name": "$HOME", "extra_args": ["--chat-template", "${X}"]},
    }
    prof = _load(tmp_path, doc)
    assert_reads_exactly(systemd, launch.build(prof), prof)


def test_working_directory_ending_in_backslash_is_refused(tmp_path: Path) -> None:
    """`/srv/sglang\\` made the next line (Environment="NCCL_PROTO=LL") part of WorkingDirectory."""
    with pytest.raises(ProfileError) as info:
        _load(tmp_path, {"extends": "cg_5tok", "service": {"working_directory": "/srv/sglang\\"}})
    assert [p.loc for p in info.value.problems] == ["service.working_directory"]
    assert "backslash" in info.value.problems[0].message


def test_working_directory_ending_in_two_backslashes_reads_back(systemd: Systemd, tmp_path: Path) -> None:
    """An even count of trailing backslashes is no continuation: the path is kept, NCCL_PROTO too."""
    prof = _load(tmp_path, {"extends": "cg_5tok", "service": {"working_directory": "/srv/sglang\\\\"}})
    assert_reads_exactly(systemd, launch.build(prof), prof)


#: Values systemd refuses or changes, by the profile field they are refused at.
REFUSED = [
    ("server.python", '/usr/bin/py"thon'),
    ("server.python", "/usr/bin/py'thon"),
    ("server.python", "/usr/bin/py\\thon"),
    ("server.python", "/usr/bin/py\x7fthon"),
    ("server.python", "/usr/bin/python3/"),
    ("server.python", "/opt/$venv/bin/python"),
    ("server.python", "/opt/" + "v" * 256 + "/python"),
    ("service.working_directory", "/srv/sglang\\"),
    ("service.working_directory", "/srv/../sglang"),
    ("service.working_directory", "/srv/sglang "),
    ("service.working_directory", "/srv//sglang"),
    ("service.working_directory", "/srv/./sglang"),
    ("service.working_directory", "/srv/sglang/"),
    ("service.working_directory", "/" + "d/" * 2047 + "d"),
    ("env.NAÏVE", "1"),
    ("env.A\u0661", "1"),
    ("env.A-B", "1"),
    ("env.1X", "1"),
    ("env.", "1"),
]


def _doc_with(loc: str, value: str) -> dict[str, Any]:
    section, _, key = loc.partition(".")
    return {"extends": "cg_5tok", section: {key: value}}


@pytest.mark.parametrize(("loc", "value"), REFUSED, ids=lambda v: repr(v)[:40])
def test_values_systemd_refuses_are_profile_errors(loc: str, value: str, tmp_path: Path) -> None:
    with pytest.raises(ProfileError) as info:
        _load(tmp_path, _doc_with(loc, value))
    problems = info.value.problems
    assert [p.loc for p in problems] == [loc], problems
    assert "systemd" in problems[0].message and "\n" not in str(problems[0])


@pytest.mark.parametrize(("loc", "value"), REFUSED, ids=lambda v: repr(v)[:40])
def test_each_refusal_is_systemds(loc: str, value: str, systemd: Systemd) -> None:
    """The same values, put in a unit past validation: systemd refuses them or reads something else."""
    good = profile_mod.load("cg_5tok")
    p = launch.build(good)
    unit, env = p.unit, dict(p.environment)
    if loc == "server.python":
        unit = unit.replace("ExecStart=/usr/bin/python3 ", f"ExecStart={launch.quote_exec_arg(value)} ", 1)
    elif loc == "service.working_directory":
        unit = unit.replace("WorkingDirectory=/\n", f"WorkingDirectory={value}\n", 1)
    else:
        name = loc.partition(".")[2]
        env[name] = value
        unit = unit.replace(
            "Environment=", f"Environment={launch.environment_line(name, value)}\nEnvironment=", 1
        )
    reading = systemd.read(unit)
    exact = (
        reading.load_state == "loaded"
        and not reading.complaints
        and reading.executable == (value if loc == "server.python" else good.server.python)
        and reading.argv == ([value, *p.argv[1:]] if loc == "server.python" else p.argv)
        and reading.environment == env
        and reading.working_directory == (value if loc == "service.working_directory" else "/")
    )
    assert not exact, f"systemd reads {value!r} back unchanged: the rule for {loc} refuses too much"


#: Every character a quoting or escaping rule is about, alone and together, with surrounding spaces.
SPECIAL_VALUES = [
    *"\\\"'%$\t\n\r\x01\x1b\x7f",
    "$HOME",
    "${X}",
    "$$",
    "%n%%",
    ";",
    "",
    "  padded\t",
    "all: \\ \" ' % $X ${Y} \t \n \r \x01 \x7f é 😀 ; # ~",
    launch.CREDENTIAL_ARG,  # a profile's own text, never the word systemd expands
    "\x9b2J\x9d0;t\x07 \x85 \u202eevil\ufeff\u2028",  # C1 controls and bidi marks: written as \\u escapes
]


@pytest.mark.parametrize("value", SPECIAL_VALUES, ids=ascii)
def test_special_characters_read_back_in_every_field(value: str, systemd: Systemd, tmp_path: Path) -> None:
    doc = {
        "extends": "cg_5tok",
        # An empty served_model_name is refused (it would be dropped): the name "-" stands in.
        "server": {"served_model_name": value or "-", "extra_args": ["--chat-template", value]},
        "env": {"A": value},
        "nccl": {"NCCL_DEBUG_FILE": value},
    }
    if value.isprintable():  # paths hold no control characters (AbsPath)
        doc["server"]["model_path"] = f"/data/{value}"
        doc["speculative"] = {"draft_model_path": f"/data/{value}/d"}
        doc["service"] = {"working_directory": f"/srv/a{value}b"}
        if not systemd_rules.executable_problems(f"/opt/py{value}"):
            doc["server"]["python"] = f"/opt/py{value}"
    prof = _load(tmp_path, doc)
    assert_reads_exactly(systemd, launch.build(prof), prof)


def test_the_credential_word_from_a_profile_reaches_sglang_as_written(
    systemd: Systemd, tmp_path: Path
) -> None:
    """#21: only the --config word plan emits is left for systemd to expand, by its place. The same
    text as served_model_name or in extra_args was written unescaped too, so systemd replaced it
    with the unit's credentials directory (the server would have read the API key file as its chat
    template)."""
    doc = {
        "extends": "cg_5tok",
        "server": {
            "served_model_name": launch.CREDENTIAL_ARG,
            "extra_args": ["--chat-template", launch.CREDENTIAL_ARG],
        },
        "api_key": {"env": "SGLANG_KEY"},
    }
    prof = _load(tmp_path, doc)
    p = launch.build(prof)
    argv = systemd.read(p.unit).argv
    assert argv[argv.index("--served-model-name") + 1] == launch.CREDENTIAL_ARG
    assert argv[argv.index("--chat-template") + 1] == launch.CREDENTIAL_ARG
    assert argv[argv.index("--config") + 1] == f"{CREDENTIALS}/{launch.CREDENTIAL}"
    assert_reads_exactly(systemd, p, prof)


def test_the_adaptive_config_word_is_expanded_beside_the_api_keys(systemd: Systemd, tmp_path: Path) -> None:
    """speculative.adaptive with tiers: a second credential word, expanded by its place like the
    --config one; the config's text in the unit's comment is nothing to systemd."""
    spec = {
        "eagle_topk": None,
        "num_draft_tokens": None,
        "adaptive": {"tiers": {1: [1, 3]}, "ema_alpha": 0.3},
    }
    doc = {"extends": "cg_5tok", "server": {"sglang_version": "0.5.23"}, "speculative": spec}
    prof = _load(tmp_path, {**doc, "api_key": {"env": "SGLANG_KEY"}})
    p = launch.build(prof)
    argv = assert_reads_exactly(systemd, p, prof).argv
    assert (
        argv[argv.index("--speculative-adaptive-config") + 1] == f"{CREDENTIALS}/{launch.ADAPTIVE_CREDENTIAL}"
    )
    assert argv[argv.index("--config") + 1] == f"{CREDENTIALS}/{launch.CREDENTIAL}"


def _env_file_reading(text: str, tmp: Path) -> dict[str, str]:
    """What systemd's environment-file parser (parse_env_file_internal(), which EnvironmentFile=
    uses through load_env_file()) makes of `text`: the environment.d generator reads a file with
    the same parser and prints the variables; those of this machine's own environment.d are left out."""
    generator = Path("/usr/lib/systemd/user-environment-generators/30-systemd-environment-d-generator")
    if not generator.exists():
        pytest.skip(f"{generator} is missing: systemd is not installed here")

    def read(body: str) -> dict[str, str]:
        (tmp / "environment.d").mkdir(exist_ok=True)
        (tmp / "environment.d" / "50-test.conf").write_text(body)
        out = subprocess.run(
            ["env", "-i", f"XDG_CONFIG_HOME={tmp}", str(generator)],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        return dict(line.split("=", 1) for line in out.splitlines())

    machine = read("")
    return {k: v for k, v in read(text).items() if machine.get(k) != v}


def test_a_secret_env_name_with_a_newline_is_refused_where_systemd_would_set_another(tmp_path: Path) -> None:
    """#21: `"A\\nLD_PRELOAD"` became two lines of the EnvironmentFile=, and systemd set LD_PRELOAD."""
    name, ref = "A\nLD_PRELOAD", {"env": "X"}
    with pytest.raises(ProfileError) as info:
        _load(tmp_path, {"extends": "cg_5tok", "secret_env": {name: ref}})
    assert [p.loc for p in info.value.problems] == [f"secret_env.{name}"]
    assert "systemd" in info.value.problems[0].message and "\n" not in str(info.value.problems[0])
    # The line secrets.py would have written for it, as systemd reads it.
    assert _env_file_reading(secrets._env_line(name, "/tmp/evil.so"), tmp_path) == {
        "LD_PRELOAD": "/tmp/evil.so"
    }


def test_an_environment_file_export_line_is_one_systemd_drops(tmp_path: Path) -> None:
    """systemd's parser knows no `export`: `export A=1` names "export A" (refused in
    service.environment_files: tests/unit/test_real_host_profile.py)."""
    assert _env_file_reading("export A=1\n  B = 2\n", tmp_path) == {"B": "2"}


@pytest.mark.parametrize(
    ("name", "verify_accepts", "loads"),
    [
        ("sglang@.service", True, "Unit name sglang@.service is missing the instance name"),
        ("@.service", False, None),
        ("s" * 248 + ".service", False, None),
    ],
)
def test_each_refused_unit_name_is_one_systemd_cannot_run(
    name: str, verify_accepts: bool, loads: str | None, systemd: Systemd, tmp_path: Path
) -> None:
    """#21: the host's `systemd-analyze verify` (sglang_unit's check before it writes) passes a
    template, which PID 1's own loader then cannot run: `systemd --test` with it as its default unit
    says so. The others systemd refuses outright (a file name of 256 bytes cannot even be created)."""
    assert systemd_rules.unit_name_problems(name)
    path = tmp_path / name
    with contextlib.suppress(OSError):
        path.write_text("[Service]\nExecStart=/bin/true\n")
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is missing: systemd is not installed here")
    verify = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert (verify.returncode == 0) == verify_accepts, verify.stderr
    if loads is None:
        return
    unit = systemd.unit_dir / name
    unit.write_text(path.read_text())
    unit.chmod(0o644)
    try:
        test_mode = ["--test", "--system", f"--unit={name}", "--no-pager"]
        result = subprocess.run(
            [*systemd.prefix, "env", "-i", f"SYSTEMD_UNIT_PATH={systemd.unit_dir}", str(SYSTEMD), *test_mode],
            capture_output=True,
            text=True,
            cwd="/",
            timeout=60,
            check=False,
        )
    finally:
        unit.unlink()
    block = result.stdout.partition(f"\t-> Unit {name}:\n")[2].split("\n\t-> Unit ")[0]
    assert loads in result.stderr + block, (result.stderr, block)


# --- every shipped profile -----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(profile_mod.available()))
def test_every_shipped_profile_reads_back_exactly(name: str, systemd: Systemd) -> None:
    prof = profile_mod.load(name)
    assert_reads_exactly(systemd, launch.build(prof), prof)


def test_multinode_plan_reads_back_exactly(systemd: Systemd) -> None:
    prof = profile_mod.load("cg_5tok_2node")
    p = launch.build(prof, launch.Node(rank=1, nnodes=2, dist_init_addr="[fd00::1]:5757"))
    assert_reads_exactly(systemd, p, prof)


def test_real_host_options_read_back_as_systemd_means_them(systemd: Systemd, tmp_path: Path) -> None:
    """#14: a GPU subset, limits, a restart policy, site directives, secrets by file and credential."""
    doc = {
        "extends": "cg_5tok",
        "server": {"tp_size": 4, "gpus": "4-7", "port": 30001},
        "service": {
            "unit_name": UNIT,
            "user": "sglang",
            "restart": "on-failure",
            "restart_sec": 5,
            "limits": {"nofile": 65536},
            "extra": {"CPUAffinity": "0-31 64-95", "Nice": -5, "NUMAPolicy": "bind", "NUMAMask": "0"},
        },
        "api_key": {"env": "SGLANG_KEY"},
        "secret_env": {"HF_TOKEN": {"env": "HF_TOKEN"}},
    }
    prof = _load(tmp_path, doc)
    p = launch.build(prof)
    reading = assert_reads_exactly(systemd, p, prof)
    assert reading.environment["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert "HF_TOKEN" not in p.unit and "SGLANG_KEY" not in p.unit
    assert reading.setting("EnvironmentFile") == [f"{launch.HOST_STATE_DIR}/sglang.env"]
    assert reading.setting("User") == ["sglang"]
    assert reading.setting("Restart") == ["on-failure"]
    assert reading.setting("RestartSec") == ["5s"]
    assert reading.setting("LimitMEMLOCK") == [str(2**64 - 1)]  # infinity
    assert reading.setting("LimitNOFILE") == ["65536"]
    assert reading.setting("Nice") == ["-5"]
    assert reading.setting("CPUAffinity") == ["0-31 64-95"]
    assert reading.argv[-2:] == ["--config", f"{CREDENTIALS}/sglang-config.yaml"]


# --- [Service] settings as systemd reads them (#21: what systemd ignores or reads otherwise) ------

#: service.limits' fields, by the directive each renders.
LIMIT_FIELDS = {"LimitNOFILE": "nofile", "LimitMEMLOCK": "memlock"}
#: Where the dump prints a setting under another name than its directive's.
DUMP_NAME = {"IOSchedulingPriority": "IOPriority"}
SIZES = {"MemoryMax", "MemoryHigh", "LimitCORE", "LimitSTACK", "LimitMEMLOCK"}
KEYWORDS = {"NUMAPolicy", "IOSchedulingClass", "CPUSchedulingPolicy"}
USEC = 10**6
_SPANS = [
    ("y", 31557600 * USEC),
    ("month", 2629800 * USEC),
    ("w", 604800 * USEC),
    ("d", 86400 * USEC),
    ("h", 3600 * USEC),
    ("min", 60 * USEC),
    ("s", USEC),
    ("ms", 1000),
    ("us", 1),
]


def _timespan(usec: int, accuracy: int = USEC) -> str:
    """format_timespan() (src/basic/time-util.c), as the dump prints RestartSec= and TimeoutAbortSec=
    (to the second: a smaller span shows its first unit only)."""
    if usec >= 2**64 - 1:
        return "infinity"
    parts: list[str] = []
    for suffix, size in _SPANS:
        if usec <= 0 or (usec < accuracy and parts):
            break
        if usec < size:
            continue
        whole, rest = divmod(usec, size)
        digits = len(str(size)) - len(str(accuracy))  # the dot notation, under a minute
        if usec < 60 * USEC and rest and digits > 0:
            parts.append(f"{whole}.{rest // accuracy:0{digits}d}{suffix}")
            break
        parts.append(f"{whole}{suffix}")
        usec = rest
    return " ".join(parts) or "0"


def _ranges(indexes: list[int]) -> str:
    """cpu_set_to_range_string(): sorted runs, `a-b` or `a`, joined by spaces."""
    runs: list[list[int]] = []
    for i in sorted(set(indexes)):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return " ".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def _meaning(directive: str, value: str) -> str | None:
    """What the dump shows for `value` read as written: decimal numbers, 1024-based sizes, the
    words systemd.exec(5) and systemd.resource-control(5) document. None where that depends on this
    machine (percentages, NUMAMask=all) or the value is no plain spelling of one."""
    if value != value.strip() or value.endswith("%") or value == "all":
        return None
    if value == "infinity":
        return "infinity" if directive == "TimeoutAbortSec" else str(2**64 - 1)
    if directive in KEYWORDS:  # IOSchedulingClass=none: the kernel's default class, best-effort
        return "best-effort" if (directive, value) == ("IOSchedulingClass", "none") else value
    if (directive, value) == ("CPUWeight", "idle"):
        return "0"
    if directive in ("CPUAffinity", "NUMAMask"):
        if not re.fullmatch(r"[0-9]{1,5}(-[0-9]{1,5})?([ ,][0-9]{1,5}(-[0-9]{1,5})?)*", value):
            return None
        bounds = [[int(n) for n in word.split("-")] for word in re.split("[ ,]", value)]
        return _ranges([i for b in bounds for i in range(b[0], b[-1] + 1)])
    if directive in SIZES:
        size = re.fullmatch(r"([0-9]+)([KMGTPE]?)", value)
        return str(int(size[1]) * 1024 ** (" KMGTPE".index(size[2] or " "))) if size else None
    if directive == "UMask":
        return f"{int(value, 8):04o}" if re.fullmatch("[0-7]{1,4}", value) else None
    if not re.fullmatch(r"[+-]?[0-9]+", value):
        return None
    return _timespan(int(value) * USEC) if directive == "TimeoutAbortSec" else str(int(value))


def _unit_with(settings: dict[str, str]) -> str:
    """cg_5tok's unit with `settings` written raw, past validation: a directive the unit has is
    replaced where it stands, any other added at the end of [Service]."""
    unit = launch.build(profile_mod.load("cg_5tok")).unit
    for directive, value in settings.items():
        if f"\n{directive}=" in unit:
            unit = re.sub(rf"^{directive}=.*$", f"{directive}={value}", unit, count=1, flags=re.M)
        else:
            unit = unit.replace("SyslogIdentifier=", f"{directive}={value}\nSyslogIdentifier=")
    return unit


def _line(unit: str, directive: str) -> int:
    return unit[: unit.index(f"\n{directive}=") + 1].count("\n") + 1


def _misread(reading: Reading, unit: str, directive: str, value: str) -> bool:
    """systemd complains about the line, or reads another value than the one written."""
    if any(f"{UNIT}:{_line(unit, directive)}: " in c for c in reading.complaints):
        return True
    meant = _meaning(directive, value)
    return meant is not None and reading.setting(DUMP_NAME.get(directive, directive)) != [meant]


def _service_doc(settings: dict[str, str], restart_sec: float | None = None, **fields: int) -> dict[str, Any]:
    service: dict[str, Any] = {"restart": "on-failure", **fields}
    limits = {LIMIT_FIELDS[d]: v for d, v in settings.items() if d in LIMIT_FIELDS}
    extra = {d: v for d, v in settings.items() if d not in LIMIT_FIELDS}
    service |= {"limits": limits} if limits else {}
    service |= {"extra": extra} if extra else {}
    service |= {"restart_sec": restart_sec} if restart_sec is not None else {}
    return {"extends": "cg_5tok", "service": service}


#: Values systemd ignores with only a warning (the unit starts without them) or reads as another
#: number: a leading zero is octal to safe_atoi()/safe_atou64(), a range may not count down, a
#: percentage stops at 100%, a count takes no suffix, sizes and counts stop below 2^64 - 1.
REFUSED_SETTINGS = [
    ("CPUAffinity", "5-2"),
    ("CPUAffinity", "0-3,9-4"),
    ("CPUAffinity", "010"),
    ("CPUAffinity", "08"),
    ("CPUAffinity", "8192"),
    ("CPUAffinity", "0-x"),
    ("NUMAMask", "1-0"),
    ("NUMAMask", "010"),
    ("Nice", "019"),
    ("Nice", "010"),
    ("Nice", "-010"),
    ("Nice", "-21"),
    ("OOMScoreAdjust", "1001"),
    ("OOMScoreAdjust", "-0100"),
    ("IOSchedulingPriority", "8"),
    ("IOSchedulingPriority", "010"),
    ("CPUWeight", "010"),
    ("CPUWeight", "0"),
    ("CPUWeight", "10001"),
    ("MemoryMax", "101%"),
    ("MemoryMax", "0"),
    ("MemoryMax", "0%"),
    ("MemoryMax", "16E"),
    ("MemoryHigh", "100.5%"),
    ("TasksMax", "200%"),
    ("TasksMax", "0"),
    ("TasksMax", "010"),
    ("TasksMax", str(2**64 - 1)),
    ("LimitCORE", "16E"),
    ("LimitSTACK", "16E"),
    ("TimeoutAbortSec", "18446744073709"),  # parse_time(): USEC_INFINITY / USEC_PER_SEC
    ("LimitNOFILE", "1G"),
    ("LimitNOFILE", "010"),
    ("LimitNOFILE", str(2**64 - 1)),
    ("LimitMEMLOCK", "16E"),
]


@pytest.mark.parametrize(("directive", "value"), REFUSED_SETTINGS, ids=lambda v: str(v)[:24])
def test_service_values_systemd_ignores_or_changes_are_profile_errors(
    directive: str, value: str, tmp_path: Path
) -> None:
    with pytest.raises(ProfileError) as info:
        _load(tmp_path, _service_doc({directive: value}))
    [problem] = info.value.problems
    if directive in LIMIT_FIELDS:
        assert problem.loc == f"service.limits.{LIMIT_FIELDS[directive]}", problem
    else:
        assert (problem.loc, problem.message.split(": ")[:2]) == ("service", ["extra", directive]), problem
    assert "\n" not in str(problem)


def _rounds(pairs: list[tuple[str, str]]) -> list[dict[str, str]]:
    """The pairs in as few units as hold each directive once (one systemd run per unit)."""
    rounds: list[dict[str, str]] = []
    for directive, value in pairs:
        free = next((r for r in rounds if directive not in r), None)
        if free is None:
            rounds.append(free := {})
        free[directive] = value
    return rounds


@pytest.mark.parametrize("settings_", _rounds(REFUSED_SETTINGS), ids=lambda r: ",".join(r.values())[:40])
def test_each_refused_service_value_is_one_systemd_ignores_or_changes(
    settings_: dict[str, str], systemd: Systemd
) -> None:
    """The same values in a unit past validation: systemd complains about the line, or reads
    another value than the one written (`010` as 8)."""
    unit = _unit_with(settings_)
    reading = systemd.read(unit)
    assert reading.load_state == "loaded"
    for directive, value in settings_.items():
        assert _misread(reading, unit, directive, value), (
            f"systemd reads {directive}={value} as written: the rule refuses too much",
            reading.setting(DUMP_NAME.get(directive, directive)),
        )


@pytest.mark.parametrize("value", [1e-05, 0.000123, 2.5])
def test_restart_sec_reaches_systemd_as_a_decimal(value: float, systemd: Systemd, tmp_path: Path) -> None:
    """`restart_sec: 1.0e-05` was rendered RestartSec=1e-05: "Failed to parse sec value, ignoring"."""
    prof = _load(tmp_path, _service_doc({}, restart_sec=value))
    p = launch.build(prof)
    reading = assert_reads_exactly(systemd, p, prof)
    assert "e" not in re.search(r"^RestartSec=(.*)$", p.unit, re.M)[1]
    assert reading.setting("RestartSec") == [_timespan(int(Decimal(repr(float(value))) * USEC))]


@pytest.mark.parametrize("value", [1e-07, 1.5e-06, 2.5e-07])
def test_restart_sec_finer_than_a_microsecond_is_refused_as_systemd_would_cut_it(
    value: float, systemd: Systemd, tmp_path: Path
) -> None:
    with pytest.raises(ProfileError) as info:
        _load(tmp_path, _service_doc({}, restart_sec=value))
    assert [p.loc for p in info.value.problems] == ["service.restart_sec"]
    written = Decimal(repr(value)) * USEC  # microseconds, not a whole number of them
    reading = systemd.read(_unit_with({"RestartSec": systemd_rules.seconds(value)}))
    assert reading.complaints == [] and reading.setting("RestartSec") == [_timespan(int(written))] != [
        f"{written}us"
    ]


@pytest.mark.parametrize(
    "extra",
    [
        {"IOSchedulingPriority": "7", "IOSchedulingClass": "none"},  # read as best-effort 4
        {"NUMAPolicy": "bind"},  # no mask: set_mempolicy() fails, the server does not start
        {"NUMAMask": "0-1"},  # preferred, which takes one node
        {"NUMAPolicy": "local", "NUMAMask": "0"},
    ],
)
def test_extra_directives_that_undo_each_other_are_refused(extra: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(ProfileError) as info:
        _load(tmp_path, _service_doc(extra))
    [problem] = info.value.problems
    assert problem.loc == "service" and problem.message.startswith(f"extra: {next(iter(extra))[:4]}")


def test_io_scheduling_class_none_drops_an_earlier_priority(systemd: Systemd) -> None:
    reading = systemd.read(_unit_with({"IOSchedulingPriority": "7", "IOSchedulingClass": "none"}))
    assert reading.complaints == [] and reading.setting("IOPriority") == ["4"]


# Generated [Service] settings: every allow-listed directive, service.limits, restart_sec and the
# start and stop timeouts.
def _spelled(n: int, how: str) -> str:
    """`n` as written in a profile: plainly, with leading zeros, a sign, or in hex."""
    sign = "-" if n < 0 else ""
    return {"plain": str(n), "zero": f"{sign}0{abs(n)}", "zeros": f"{sign}00{abs(n)}", "plus": f"+{n}"}.get(
        how, f"{sign}{hex(abs(n))}"
    )


small_numbers = st.builds(
    _spelled, st.integers(-1100, 10100), st.sampled_from(["plain", "zero", "plus", "hex"])
)
big_numbers = st.builds(_spelled, st.integers(2**60, 2**65), st.sampled_from(["plain", "zero"]))
numbers = st.one_of(small_numbers, big_numbers, st.integers(0, 8).map(str))
cpu_words = st.builds(
    lambda low, high, zero: f"{'0' if zero else ''}{low}" + ("" if high is None else f"-{high}"),
    st.integers(0, 8200),
    st.none() | st.integers(0, 8200),
    st.booleans(),
)
cpu_lists = st.builds(
    lambda words, sep: sep.join(words),
    st.lists(cpu_words, min_size=1, max_size=3),
    st.sampled_from([",", " "]),
)
percents = st.builds(
    lambda n, decimals, zero: f"{'0' if zero else ''}{n}{decimals}%",
    st.integers(0, 150),
    st.sampled_from(["", ".5", ".25", ".125"]),
    st.booleans(),
)
sizes = st.builds(
    lambda n, suffix: f"{n}{suffix}",
    st.one_of(st.integers(0, 4096), st.integers(2**40, 2**65)),
    st.sampled_from(["", "K", "M", "G", "T", "P", "E", "B", "k", "KiB"]),
)
odd = st.sampled_from(["", " 5", "5 ", "1e3", "5.5", "x", "infinity", "-1", "1:2", "0x10"])
SETTING_VALUES: dict[str, st.SearchStrategy[str]] = {
    "CPUAffinity": cpu_lists,
    "NUMAMask": cpu_lists | st.just("all"),
    "NUMAPolicy": st.sampled_from(["default", "preferred", "bind", "interleave", "local", "Bind"]),
    "IOSchedulingClass": st.sampled_from(["realtime", "best-effort", "idle", "none", "2"]),
    "CPUSchedulingPolicy": st.sampled_from(["other", "batch", "idle", "fifo", "rr", "FIFO"]),
    "Nice": small_numbers,
    "OOMScoreAdjust": small_numbers,
    "IOSchedulingPriority": st.integers(-1, 9).map(str) | small_numbers,
    "CPUWeight": small_numbers | st.just("idle"),
    "MemoryMax": sizes | percents,
    "MemoryHigh": sizes | percents,
    "TasksMax": numbers | percents,
    "LimitCORE": sizes,
    "LimitSTACK": sizes,
    "UMask": st.builds(lambda n, zero: f"{'0' if zero else ''}{n:o}", st.integers(0, 0o17777), st.booleans()),
    "TimeoutAbortSec": numbers,
    "LimitNOFILE": numbers | sizes,
    "LimitMEMLOCK": sizes,
}
assert set(SETTING_VALUES) == {*systemd_rules.EXTRA_DIRECTIVES, *LIMIT_FIELDS}, "a directive without values"
service_settings = st.dictionaries(
    st.sampled_from(sorted(SETTING_VALUES)), st.just(""), min_size=1, max_size=7
).flatmap(lambda keys: st.fixed_dictionaries({k: SETTING_VALUES[k] | odd for k in keys}))
#: The unit's other numbers: TimeoutStartSec=, TimeoutStopSec= (whole seconds up to INT_MAX).
timeouts = st.fixed_dictionaries(
    {},
    optional={
        name: st.one_of(st.integers(1, 2**31 - 1), st.sampled_from([1, 59, 60, 3600, 2**31 - 1]))
        for name in ("start_timeout_s", "stop_timeout_s")
    },
)
restart_secs = st.one_of(
    st.none(),
    st.floats(0, 3600),
    st.sampled_from([1e-05, 1e-06, 1e-07, 0.1, 2.5, 3600, 1.5e-06, 0.333333333]),
)


def _refused(problems: list[Any], settings: dict[str, str]) -> set[str]:
    """The directives (or "restart_sec") a ProfileError's problems name, each one line and located."""
    names = set()
    for problem in problems:
        assert problem.message and "\n" not in str(problem), problem
        if problem.loc == "service.restart_sec":
            names.add("restart_sec")
        elif problem.loc.startswith("service.limits."):
            names.add(next(d for d, f in LIMIT_FIELDS.items() if problem.loc.endswith(f)))
        else:
            assert problem.loc == "service" and problem.message.startswith("extra: "), problem
            names |= {d for d in settings if f"{d}: " in problem.message}
    assert names, problems
    return names


@given(settings_=service_settings, restart_sec=restart_secs, fields=timeouts)
@example(
    settings_={"CPUAffinity": "5-2", "MemoryMax": "101%", "TasksMax": "200%", "Nice": "019"},
    restart_sec=1e-05,
    fields={},
)
@example(
    settings_={"LimitNOFILE": "1G", "UMask": "0777", "CPUWeight": "010"},
    restart_sec=1e-07,
    fields={"start_timeout_s": 2**31 - 1, "stop_timeout_s": 2**31 - 1},
)
@settings(
    max_examples=int(os.environ.get("ORACLE_SERVICE_EXAMPLES", "15")),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
def test_systemd_reads_service_settings_as_the_profile_says(
    settings_: dict[str, str], restart_sec: float | None, fields: dict[str, int], systemd: Systemd
) -> None:
    """Either a setting is refused with a located one-line problem, or systemd reads it with no
    complaint and as written (the dump's value, where it does not depend on this machine); and
    each value refused on its own is one systemd complains about or reads otherwise."""
    accepted, refused = dict(settings_), {}
    with tempfile.TemporaryDirectory() as tmp:
        while True:
            try:
                prof = _load(Path(tmp), _service_doc(accepted, restart_sec, **fields))
                break
            except ProfileError as exc:
                for name in _refused(exc.problems, accepted):
                    if name == "restart_sec":
                        restart_sec = None
                    else:
                        refused[name] = accepted.pop(name)
    event(f"read back: {len(accepted)}, refused: {len(refused)}")
    p = launch.build(prof)
    reading = assert_reads_exactly(systemd, p, prof)
    for directive, value in accepted.items():
        meant = _meaning(directive, value)
        if meant is not None:
            assert reading.setting(DUMP_NAME.get(directive, directive)) == [meant], (directive, value)
    if restart_sec is not None:
        assert reading.setting("RestartSec") == [_timespan(int(Decimal(repr(float(restart_sec))) * USEC))]
    for name, directive in (("start_timeout_s", "TimeoutStartSec"), ("stop_timeout_s", "TimeoutStopSec")):
        assert reading.setting(directive) == [_timespan(getattr(prof.service, name) * USEC)]
    alone = {d: v for d, v in refused.items() if systemd_rules.EXTRA_DIRECTIVES.get(d, lambda v: "x")(v)}
    alone |= {d: v for d, v in refused.items() if d in LIMIT_FIELDS}
    if alone:
        unit = _unit_with(alone)
        misread = systemd.read(unit)
        for directive, value in alone.items():
            if directive in ("CPUAffinity", "NUMAMask") and re.search("[ ,]", value):
                continue  # in a set, one word read as another index may still give the same set
            assert _misread(misread, unit, directive, value) or _meaning(directive, value) is None, (
                f"systemd reads {directive}={value} as written: the rule refuses too much"
            )


# --- container runtimes (#17) -------------------------------------------------------------------

CONTAINER_IMAGE = "docker.io/lmsysorg/sglang:v0.5.9-cu129-amd64@sha256:" + "0123456789abcdef" * 4


def _container_doc(kind: str, value: str) -> dict[str, Any]:
    """Every free-text value a container unit carries, in the engine's words and in SGLang's."""
    return {
        "extends": "cg_5tok",
        "server": {
            "tp_size": 4,
            "gpus": "4-7",
            "served_model_name": value or "-",  # an empty one is refused
            "extra_args": ["--chat-template", value],
        },
        "env": {"A": value},
        "nccl": {"NCCL_DEBUG_FILE": value},
        "api_key": {"env": "SGLANG_KEY"},
        "secret_env": {"HF_TOKEN": {"env": "HF_TOKEN"}},
        "service": {"unit_name": UNIT, "restart": "on-failure"},
        "runtime": {
            "kind": kind,
            "image": CONTAINER_IMAGE,
            "ipc_host": False,
            "shm_size": "32g",
            "mounts": [{"source": "/data/hf", "target": "/root/.cache/huggingface", "read_only": False}],
            "options": ["--cap-add=IPC_LOCK", "--ulimit=core=0", "--init"],
        },
    }


def _commands(reading: Reading, directive: str) -> list[list[str]]:
    """The command lines systemd read for ExecStartPre=, ExecStop=, ExecStopPost=."""
    block = re.search(rf"^\t\t-> {directive}:\n((?:\t\t\t.*\n)+)", reading.dump + "\n", re.M)
    lines = re.findall(r"^\t\t\tCommand Line: (.*)$", block.group(1), re.M) if block else []
    return [_command_line(line.encode()) for line in lines]


@pytest.mark.parametrize("kind", ["docker", "podman"])
@pytest.mark.parametrize("value", ["plain", *SPECIAL_VALUES], ids=ascii)
def test_container_units_read_back_exactly(kind: str, value: str, systemd: Systemd, tmp_path: Path) -> None:
    """systemd runs the engine with exactly the planned words, SGLang's argv last; the environment
    reaches the container through them, and the unit itself sets none."""
    prof = _load(tmp_path, _container_doc(kind, value))
    p = launch.build(prof)
    reading = systemd.read(p.unit)
    assert reading.complaints == [] and reading.load_state == "loaded", (reading.complaints, p.unit)
    assert reading.executable == container_unit.ENGINES[kind]
    started = p.started_argv(CREDENTIALS)
    assert reading.argv == [*p.engine_argv, *started] and reading.argv[-len(p.argv) :] == started
    assert reading.environment == {}
    assert launch.parse_unit(p.unit) == (p.argv, p.environment)
    assert launch.parse_unit(p.unit, {"CREDENTIALS_DIRECTORY": CREDENTIALS})[0] == started
    assert p.environment["A"] == value and f"--env=A={value}" in reading.argv
    name = UNIT.removesuffix(".service")
    if kind == "podman":
        assert reading.setting("Type") == ["notify"] and reading.setting("NotifyAccess") == ["all"]
        assert reading.setting("Delegate") == ["yes"] and reading.setting("KillMode") == ["mixed"]
        assert _commands(reading, "ExecStop") == [["/usr/bin/podman", "stop", "--ignore", "-t", "60", name]]
        assert _commands(reading, "ExecStopPost") == [["/usr/bin/podman", "rm", "-f", "--ignore", name]]
    else:
        assert reading.setting("Type") == ["exec"] and reading.setting("KillMode") == ["control-group"]
        assert _commands(reading, "ExecStartPre") == [["/usr/bin/docker", "rm", "-f", name]]
        assert _commands(reading, "ExecStop") == [["/usr/bin/docker", "stop", "-t", "60", name]]
    assert reading.setting("TimeoutStopSec") == ["2min"]  # the engine's -t 60, and systemd's margin


@pytest.mark.parametrize("kind", ["host", "docker", "podman"])
def test_systemd_analyze_verify_accepts_container_units(kind: str, tmp_path: Path) -> None:
    """What the host's `systemd-analyze verify` (sglang_unit's validate:) will say: nothing. It also
    checks that the executable exists, which for a container unit is the engine."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is missing: systemd is not installed here")
    doc = _container_doc(kind, "plain") if kind != "host" else {"extends": "cg_5tok"}
    if kind == "host":
        doc["service"] = {"unit_name": UNIT}
    elif not Path(container_unit.ENGINES[kind]).exists():
        pytest.skip(
            f"{container_unit.ENGINES[kind]} is missing: install {kind} (scripts/setup.sh --test installs it)"
        )
    path = tmp_path / UNIT
    path.write_text(launch.build(_load(tmp_path, doc)).unit)
    result = subprocess.run(
        [analyze, "verify", str(path)], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, ""), result.stderr
    path.write_text(path.read_text().replace("KillMode=", "KillMode=bogus-"))  # and it does read the unit
    result = subprocess.run(
        [analyze, "verify", str(path)], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert "Failed to parse kill mode" in result.stderr, result.stderr


# --- values that cannot reach the process (#21) --------------------------------------------------


def _merged(doc: dict[str, Any]) -> profile_mod.Profile:
    """cg_5tok with `doc` merged in, validated without YAML (these values are large)."""
    base, _ = profile_mod.load_raw("cg_5tok")
    return profile_mod.validate(profile_mod.merge(base, {k: v for k, v in doc.items() if k != "extends"}))


def _execve(argv: list[str], env: dict[str, str]) -> OSError | None:
    """The kernel's verdict on argv's words (after argv[0]) and `env`: execve() of /bin/true with
    them, under the 8 MiB stack limit a service gets."""
    _, hard = resource.getrlimit(resource.RLIMIT_STACK)

    def stack() -> None:
        resource.setrlimit(resource.RLIMIT_STACK, (systemd_rules.DEFAULT_STACK, hard))

    try:
        subprocess.run(["/bin/true", *argv[1:]], env=env, preexec_fn=stack, check=True)
    except OSError as exc:
        return exc
    return None


def _refusal(prof: profile_mod.Profile) -> list[tuple[str, str]]:
    with pytest.raises(ProfileError) as info:
        launch.build(prof)
    for problem in info.value.problems:
        assert "\n" not in str(problem) and problem.message.endswith(("shorten it", "largest values"))
    return [(p.loc, p.message) for p in info.value.problems]


def test_an_argument_over_max_arg_strlen_is_refused_as_execve_refuses_it(systemd: Systemd) -> None:
    """A word of 128 KiB with its NUL reaches the server; one byte more and execve() fails (E2BIG)."""
    limit = systemd_rules.MAX_ARG_STRLEN
    fits = _merged({"server": {"extra_args": ["--chat-template", "x" * (limit - 1)]}})
    p = launch.build(fits)
    assert _execve(p.argv, {}) is None
    assert_reads_exactly(systemd, p, fits)
    [(loc, message)] = _refusal(_merged({"server": {"extra_args": ["--chat-template", "x" * limit]}}))
    assert loc == "server.extra_args[1]" and "MAX_ARG_STRLEN of 131072" in message
    assert getattr(_execve([*p.argv[:-1], "x" * limit], {}), "errno", None) == errno.E2BIG


def test_an_environment_string_over_max_arg_strlen_is_refused_as_execve_refuses_it(systemd: Systemd) -> None:
    limit = systemd_rules.MAX_ARG_STRLEN
    fits = _merged({"env": {"A": "x" * (limit - 3)}})  # A=, the value, NUL
    p = launch.build(fits)
    assert _execve(p.argv, p.environment) is None
    assert_reads_exactly(systemd, p, fits)
    [(loc, message)] = _refusal(_merged({"env": {"A": "x" * (limit - 2)}}))
    assert loc == "env.A" and "an environment string of 131073 bytes" in message
    assert getattr(_execve(p.argv, {"A": "x" * (limit - 2)}), "errno", None) == errno.E2BIG


def test_a_unit_line_over_long_line_max_is_refused_as_systemd_refuses_the_unit(
    systemd: Systemd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container's environment is words of its ExecStart=, whose continued lines systemd joins and
    reads up to LONG_LINE_MAX bytes: exactly that loads, one byte more fails the whole unit."""
    doc = _container_doc("docker", "plain")
    env = {f"E{i}": "v" * 120_000 for i in range(8)}

    def with_padding(n: int) -> profile_mod.Profile:
        return _merged({**doc, "env": {**env, "P": "p" * n}})

    def exec_start(p: launch.Plan) -> int:
        return next(j for _, d, j, _ in systemd_rules.unit_lines(p.unit) if d == "ExecStart")

    pad = 1 + systemd_rules.LONG_LINE_MAX - exec_start(launch.build(with_padding(1)))
    fits = launch.build(with_padding(pad))
    assert exec_start(fits) == systemd_rules.LONG_LINE_MAX
    reading = systemd.read(fits.unit)
    assert (reading.load_state, reading.complaints) == ("loaded", [])
    assert reading.argv == [*fits.engine_argv, *fits.started_argv(CREDENTIALS)]
    [(loc, message)] = _refusal(with_padding(pad + 1))
    assert loc.startswith("env.E") and "LONG_LINE_MAX of 1048576" in message
    monkeypatch.setattr(launch, "size_findings", lambda *_: [])  # the same unit, past the rule
    reading = systemd.read(launch.build(with_padding(pad + 1)).unit)
    assert reading.load_state != "loaded"
    assert any("No buffer space available" in c for c in reading.complaints), reading.complaints


def test_arguments_and_environment_over_what_execve_takes_are_refused_as_it_refuses_them() -> None:
    """Each variable fits, all of them do not: argv and environment share a quarter of the stack."""
    value = "v" * 110_000
    fits = _merged({"env": {f"E{i}": value for i in range(18)}})
    p = launch.build(fits)
    assert _execve(p.argv, p.environment) is None
    over = _merged({"env": {f"E{i}": value for i in range(20)}})
    [(loc, message)] = _refusal(over)
    assert loc.startswith("env.E") and "execve() takes" in message
    env = {**p.environment, **over.env}
    assert getattr(_execve(p.argv, env), "errno", None) == errno.E2BIG


# --- generated profiles ----------------------------------------------------------------------

#: Characters each rule is about, and then any character at all (not NUL or lone surrogates,
#: which loading refuses before any rule: tests/unit/test_fuzz_inputs.py covers those).
SPECIAL = [*"\"'\\%$;#~{}=-./ \t\n\r\x01\x1b\x7f", "é", "ü", "\xa0", "\u2028", "\x85", "😀", "..", "$$", "%%"]
SPECIAL += ["\u2029", "\ufdd0", "\uffff", "\U0001fffe"]  # a YAML 1.1 line break; noncharacters
chars = st.one_of(
    st.sampled_from(SPECIAL),
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
)
texts = st.lists(chars, max_size=12).map("".join)
#: Absolute paths whose components are often what path rules are about: '', '.', '..', ' ', '\\', '%'.
#: (No control characters in them: the schema refuses those in any path, before systemd's rules.)
path_parts = st.one_of(
    st.sampled_from(["", ".", "..", "srv", "a b", "x ", "\\", "%n", "$x"]),
    st.lists(chars.filter(lambda c: c >= " "), max_size=8).map("".join),
)
paths = st.lists(path_parts, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))
env_names = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True),
    st.sampled_from(["NAÏVE", "A\u0661", "1A", "A-B", "", "É"]),
)
FREE_NCCL = ["NCCL_DEBUG_FILE", "NCCL_SOCKET_IFNAME", "NCCL_TOPO_FILE", "NCCL_IB_HCA"]
#: Unit names of every character systemd takes in one, and those that read otherwise in a setting.
unit_names = st.one_of(
    st.sampled_from(["sglang\\x2da", "sglang:x", "a\\\\b", "sglang-a", "a..b", "-a", "a@b"]),
    st.from_regex(r"[A-Za-z0-9:\\_.@-]{1,12}", fullmatch=True),
).map(lambda stem: f"{stem}.service")

fields = st.fixed_dictionaries(
    {},
    optional={
        "served_model_name": texts,
        "model_path": paths,
        "draft_model_path": paths,
        "python": paths.map(lambda t: "/usr/bin" + t),
        "working_directory": paths,
        "env": st.dictionaries(env_names, texts, max_size=3),
        "nccl": st.dictionaries(st.sampled_from(FREE_NCCL), texts, max_size=2),
        "extra_args": st.lists(texts, max_size=2),
        "unit_name": unit_names,
        # The file holds non-ASCII text as is (NEL, U+2028 included), not as YAML escapes.
        "raw": st.just(True),
    },
)


def _profile_doc(values: dict[str, Any]) -> dict[str, Any]:
    server = {k: values[k] for k in ("served_model_name", "model_path", "python") if k in values}
    if "extra_args" in values:
        server["extra_args"] = [w for v in values["extra_args"] for w in ("--chat-template", v)]
        server["extra_args"] += [f"--tokenizer-path={v}" for v in values["extra_args"]]
    doc: dict[str, Any] = {"extends": "cg_5tok", "server": server}
    if "draft_model_path" in values:
        doc["speculative"] = {"draft_model_path": values["draft_model_path"]}
    service = {k: values[k] for k in ("working_directory", "unit_name") if k in values}
    if service:
        doc["service"] = service
    for section in ("env", "nccl"):
        if section in values:
            doc[section] = values[section]
    return doc


#: Where a refusal of each generated field may be located.
FIELD_LOCS = re.compile(
    r"(server\.(served_model_name|model_path|python|extra_args\[\d+\])|speculative\.draft_model_path"
    r"|service\.(working_directory|unit_name)|env\..*|nccl\..*|env|nccl)",
    re.S,
)


def _without(values: dict[str, Any], loc: str) -> dict[str, Any]:
    """The generated values less the one a problem is located at."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in values.items()}
    section, dot, key = loc.partition(".")
    if section in ("env", "nccl") and dot:  # a name, which may be empty
        out.get(section, {}).pop(key, None)
    else:
        out.pop(re.sub(r"\[\d+\]$", "", key or section), None)
    return out


def _refused_examples(test: Any) -> Any:
    """Every REFUSED value as an explicit example too: the oracle itself bites when a rule goes."""
    for loc, value in REFUSED:
        section, _, key = loc.partition(".")
        test = example(values={section: {key: value}} if section == "env" else {key: value})(test)
    return test


@_refused_examples
@example(values={"unit_name": "sglang\\x2da.service"})  # systemd's CacheDirectory= is orchestrator/sglang-a
@example(values={"unit_name": "sglang:x.service"})  # orchestrator/sglang, and a link
@example(values={"env": {"A": "a\x85b"}, "raw": True})  # a space to the YAML 1.1 reader
@example(values={"env": {"A": "a\ufdd0b"}})  # not UTF-8 clean to systemd
@given(values=fields)
@settings(
    max_examples=int(os.environ.get("ORACLE_EXAMPLES", "100")),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
def test_systemd_reads_what_the_profile_says(values: dict[str, Any], systemd: Systemd) -> None:
    """Refused values are dropped one by one, so the rest of each example still meets systemd."""
    with tempfile.TemporaryDirectory() as tmp:
        while True:
            doc = _profile_doc(values)
            try:
                prof = _load(Path(tmp), doc, raw=values.get("raw", False))
                break
            except ProfileError as exc:
                for problem in exc.problems:
                    assert FIELD_LOCS.fullmatch(problem.loc), (problem, doc)
                    assert problem.message and "\n" not in str(problem), problem
                    event(f"refused: {problem.loc.split('.')[1].split('[')[0]}")
                    values = _without(values, problem.loc)
    event(f"read back: {len(values)} generated fields")
    _assert_as_written(prof, doc)
    assert_reads_exactly(systemd, launch.build(prof), prof)


def _assert_as_written(prof: profile_mod.Profile, doc: dict[str, Any]) -> None:
    """Each generated value the profile took is the text the file was given (a YAML reader's line
    break in it would have been a space)."""
    for section, model in (
        ("server", prof.server),
        ("speculative", prof.speculative),
        ("service", prof.service),
    ):
        for key, value in doc.get(section, {}).items():
            assert getattr(model, key) == value, (section, key)
    for section, taken in (("env", prof.env), ("nccl", prof.nccl)):
        for key, value in doc.get(section, {}).items():
            assert taken[key] == value, (section, key)


# --- YAML 1.2: what the file says is what systemd reads (#21) ----------------------------------


def test_number_like_text_reaches_systemd_as_written(systemd: Systemd, tmp_path: Path) -> None:
    """YAML 1.1 made env 1.10 into 1.1, 0x10 into 16, 12:30 into 750 and UMask 0777 into 511 (which
    systemd then read as octal 0511). The file's text is written by hand: safe_dump would quote it."""
    path = tmp_path / "p.yml"
    path.write_text(
        "extends: cg_5tok\nenv: {A: 1.10, B: 0x10, C: 010, D: 12:30, E: yes}\n"
        "nccl: {NCCL_BUFFSIZE: 0x400000}\nservice: {extra: {UMask: 0777}}\n"
    )
    prof = profile_mod.load(str(path))
    reading = assert_reads_exactly(systemd, launch.build(prof), prof)
    env = reading.environment
    assert [env[k] for k in "ABCDE"] == ["1.10", "0x10", "010", "12:30", "yes"]
    assert env["NCCL_BUFFSIZE"] == "0x400000"
    assert reading.setting("UMask") == ["0777"]


def test_c1_controls_and_bidi_marks_never_reach_the_unit_raw(systemd: Systemd, tmp_path: Path) -> None:
    """`render` prints the unit: an 8-bit CSI (U+009B) or a right-to-left override in a value would
    drive or disguise the terminal. They are written as \\u escapes, which systemd reads back."""
    value = "\x9b2J\x9d0;t\x07\u202eevil\ufeff"
    prof = _load(
        tmp_path, {"extends": "cg_5tok", "env": {"A": value}, "server": {"served_model_name": value}}
    )
    p = launch.build(prof)
    assert not any(0x80 <= ord(ch) <= 0x9F or ch in "\u202e\ufeff" for ch in p.unit), p.unit
    reading = assert_reads_exactly(systemd, p, prof)
    assert reading.environment["A"] == value
