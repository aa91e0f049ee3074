"""What a profile names is what systemd and the engines read: the unit name, cache, mounts and text.

- service.unit_name: systemd makes the unit's cache directory from CacheDirectory=orchestrator/<stem>,
  and the compile caches' variables name /var/cache/orchestrator/<stem>/... A name that systemd reads
  otherwise there (`\\x2d` is '-', ':' starts a link's name) is refused. For every name accepted,
  systemd's own reading (`systemd --test`) makes the directory the variables name.
- A container mount on the unit's cache directory or on the API key's credential file: podman
  refuses "duplicate mount destination" after `render` passed. Refused at validation, naming both.
- U+0085 (NEL), U+2028 and U+2029 written as is in the file: the YAML 1.1 reader of profiles takes
  them for line breaks, so the server got a space (systemd itself keeps them: written as an escape,
  they reach it intact). Refused at their field, with the code point.
- Unicode noncharacters (U+FDD0, U+FFFF, ...): systemd refuses a unit line holding one as "not
  UTF-8 clean". Refused at their field.

systemd's test mode runs as in tests/unit/test_systemd_oracle.py; podman over a storage root of its
own, as in tests/unit/test_container_cli.py. Each skips, saying why, where the program is missing.
"""

from __future__ import annotations

import posixpath
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_systemd_oracle as oracle
import yaml

from orchestrator.errors import ProfileError
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch

IMAGE = "docker.io/lmsysorg/sglang:v0.5.9-cu129-amd64@sha256:" + "0123456789abcdef" * 4
#: The compile caches' variables (launch.COMPILE_CACHES), as a user of the server knows them.
CACHE_VARIABLES = ["TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH"]


def _write(tmp: Path, doc: dict[str, Any] | str) -> Path:
    path = tmp / "p.yml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


def _load(tmp: Path, doc: dict[str, Any] | str) -> profile_mod.Profile:
    return profile_mod.load(str(_write(tmp, doc)))


def _refused(tmp: Path, doc: dict[str, Any] | str) -> list[tuple[str, str]]:
    """(field, message) of each problem loading the profile reports."""
    with pytest.raises(ProfileError) as info:
        _load(tmp, doc)
    for problem in info.value.problems:
        assert "\n" not in str(problem), problem
    return [(p.loc, p.message) for p in info.value.problems]


def _past_validation(doc: dict[str, Any]) -> profile_mod.Profile:
    """cg_5tok with `doc` merged in, through the schema only: no rule, no check of the file's text."""
    base, _ = profile_mod.load_raw("cg_5tok")
    return profile_mod.Profile.model_validate(profile_mod.merge(base, doc))


@pytest.fixture(scope="module")
def systemd() -> Iterator[oracle.Systemd]:
    prefix = oracle._prefix()
    with tempfile.TemporaryDirectory(prefix="unit-names-") as tmp:
        unit_dir = Path(tmp)
        unit_dir.chmod(0o755)
        for stub in oracle.STUBS:
            (unit_dir / stub).write_text("[Unit]\nDefaultDependencies=no\n")
            (unit_dir / stub).chmod(0o644)
        yield oracle.Systemd(prefix, unit_dir)


def _cache_reading(systemd: oracle.Systemd, plan: launch.Plan) -> tuple[list[str], dict[str, str]]:
    """The unit's CacheDirectory= values and environment as systemd's test mode reads them, the
    unit file named as on a host."""
    path = systemd.unit_dir / plan.unit_name
    path.write_text(plan.unit)
    path.chmod(0o644)
    try:
        test_mode = ["--test", "--system", f"--unit={plan.unit_name}", "--no-pager"]
        result = subprocess.run(
            [
                *systemd.prefix,
                "env",
                "-i",
                f"SYSTEMD_UNIT_PATH={systemd.unit_dir}",
                str(oracle.SYSTEMD),
                *test_mode,
            ],
            capture_output=True,
            text=True,
            cwd="/",
            timeout=60,
            check=False,
        )
    finally:
        path.unlink()
    block = result.stdout.partition(f"\t-> Unit {plan.unit_name}:\n")[2].split("\n\t-> Unit ")[0]
    assert "\t\tUnit Load State: loaded\n" in block, (result.stderr, block)
    lines = [line.removeprefix("\t\t") for line in block.splitlines()]
    directories = [
        line.removeprefix("CacheDirectory: ") for line in lines if line.startswith("CacheDirectory: ")
    ]
    env = dict(
        line.removeprefix("Environment: ").split("=", 1) for line in lines if line.startswith("Environment: ")
    )
    return directories, env


# --- service.unit_name and the cache directory ----------------------------------------------------

#: Names systemd takes as unit names, each either refused or read as written.
UNIT_NAMES = [
    "sglang.service",
    "sglang-a.service",
    "sglang_b.2.service",
    "a..b.service",
    "sglang\\x2da.service",  # the backslash escape for '-', as systemd-escape writes it
    "sglang:x.service",
    "a:b\\x3a.service",
]


def test_a_unit_name_is_refused_or_systemd_makes_the_cache_directory_its_variables_name(
    systemd: oracle.Systemd, tmp_path: Path
) -> None:
    """`sglang\\x2da.service` made /var/cache/orchestrator/sglang-a, its variables named .../sglang\\x2da/...;
    `sglang:x.service` made orchestrator/sglang (sglang.service's) and a link."""
    accepted = []
    for name in UNIT_NAMES:
        try:
            prof = _load(tmp_path, {"extends": "cg_5tok", "service": {"unit_name": name}})
        except ProfileError as exc:
            [(loc, message)] = [(p.loc, p.message) for p in exc.problems]
            assert loc == "service.unit_name" and repr(name) in message, (name, message)
            assert (
                "CacheDirectory=" in message and "use only ASCII letters, digits, '-', '_' and '.'" in message
            )
            # The refusal is systemd's: past validation, it makes another directory.
            plan = launch.build(_past_validation({"service": {"unit_name": name}}))
            directories, env = _cache_reading(systemd, plan)
            named = {posixpath.dirname(env[variable]) for variable in CACHE_VARIABLES}
            assert named != {f"/var/cache/{directories[0]}"}, (name, directories, named)
            continue
        accepted.append(name)
        plan = launch.build(prof)
        directories, env = _cache_reading(systemd, plan)
        assert len(directories) == 1, (name, directories)
        for variable in CACHE_VARIABLES:
            assert posixpath.dirname(env[variable]) == f"/var/cache/{directories[0]}", (name, env)
        assert env == plan.environment
    assert accepted == ["sglang.service", "sglang-a.service", "sglang_b.2.service", "a..b.service"]


def test_the_refusal_names_the_unit_name_and_what_systemd_reads(tmp_path: Path) -> None:
    [(loc, message)] = _refused(
        tmp_path, {"extends": "cg_5tok", "service": {"unit_name": "sglang\\x2da.service"}}
    )
    assert (loc, message) == (
        "service.unit_name",
        "'sglang\\\\x2da.service' has a backslash, which systemd reads in the unit's CacheDirectory= as an "
        "escape (\\x2d is '-'): its directory would not be the one the cache variables name; use only ASCII "
        "letters, digits, '-', '_' and '.'",
    )
    [(loc, message)] = _refused(
        tmp_path, {"extends": "cg_5tok", "service": {"unit_name": "sglang:x.service"}}
    )
    assert (
        loc == "service.unit_name"
        and "':', which systemd reads in the unit's CacheDirectory= as the start" in message
    )


def test_a_unit_name_is_refused_so_even_without_a_cache(tmp_path: Path) -> None:
    """One rule for every unit: the name reaches other settings and files too."""
    doc = {"extends": "cg_5tok", "service": {"unit_name": "sglang:x.service", "compile_cache": False}}
    assert [loc for loc, _ in _refused(tmp_path, doc)] == ["service.unit_name"]


# --- container mounts on the unit's own ------------------------------------------------------------


def _container(doc: dict[str, Any]) -> dict[str, Any]:
    return {
        "extends": "cg_5tok",
        **doc,
        "runtime": {"kind": "podman", "image": IMAGE, **doc.get("runtime", {})},
    }


CACHE = "/var/cache/orchestrator/sglang"
KEY_FILE = "/run/credentials/sglang.service/sglang-config.yaml"
TIERS_FILE = "/run/credentials/sglang.service/sglang-adaptive.json"
ADAPTIVE = {
    "server": {"sglang_version": "0.5.23"},
    "speculative": {"eagle_topk": None, "num_draft_tokens": None, "adaptive": {"tiers": {1: [1, 3]}}},
}

#: (profile, field, message): each a mount podman refuses beside the unit's own.
CLASHES = [
    (
        {"runtime": {"mounts": [{"source": "/srv/c", "target": CACHE, "read_only": False}]}},
        "runtime.mounts.0.target",
        f"{CACHE} is already mounted by service.compile_cache (the unit's cache directory): choose another "
        "target",
    ),
    (
        {"runtime": {"mounts": [{"source": "/srv/c", "target": CACHE + "/."}]}},
        "runtime.mounts.0.target",
        f"{CACHE}/. is already mounted by service.compile_cache (the unit's cache directory)",
    ),
    (
        {"server": {"model_path": CACHE + "/"}},
        "server.model_path",
        f"{CACHE}/ is mounted into the container at its own path, where service.compile_cache (the unit's "
        "cache directory) is mounted already",
    ),
    (
        {"speculative": {"draft_model_path": CACHE}},
        "speculative.draft_model_path",
        f"{CACHE} is mounted into the container at its own path, where service.compile_cache",
    ),
    (
        {
            "api_key": {"env": "SGLANG_KEY"},
            "runtime": {"mounts": [{"source": "/srv/k.yaml", "target": KEY_FILE}]},
        },
        "runtime.mounts.0.target",
        f"{KEY_FILE} is already mounted by api_key (the --config file): choose another target",
    ),
    (
        {**ADAPTIVE, "runtime": {"mounts": [{"source": "/srv/t.json", "target": TIERS_FILE}]}},
        "runtime.mounts.0.target",
        f"{TIERS_FILE} is already mounted by speculative.adaptive.tiers (their config file)",
    ),
]


class Podman:
    """The podman CLI over a storage root of its own (as tests/unit/test_container_cli.py runs it)."""

    def __init__(self, binary: str, root: Path) -> None:
        self.binary, self.root = binary, root

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        options = [
            f"--root={self.root / 'storage'}",
            f"--runroot={self.root / 'run'}",
            f"--tmpdir={self.root / 'tmp'}",
            "--storage-driver=vfs",
            "--cgroup-manager=cgroupfs",
            "--events-backend=file",
        ]
        return subprocess.run([self.binary, *options, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    binary = shutil.which("podman")
    if binary is None:
        pytest.skip("no podman CLI here: apt-get install podman (scripts/setup.sh --test does)")
    # Short: podman refuses a runroot over 50 characters (an xdist worker's tmp_path is longer).
    engine = Podman(binary, Path(tempfile.mkdtemp(prefix="podman-")))
    info = engine("info", "--format", "{{.Version.Version}}")
    if info.returncode != 0:
        pytest.skip(f"podman cannot use a storage root of its own here: {info.stderr.strip()[:200]}")
    try:
        yield engine
    finally:
        engine("rm", "--all", "--force")
        shutil.rmtree(engine.root, ignore_errors=True)


@pytest.mark.parametrize(
    ("doc", "loc", "message"), CLASHES, ids=[c[1] + str(i) for i, c in enumerate(CLASHES)]
)
def test_a_mount_on_the_units_own_is_refused_as_podman_refuses_it(
    doc: dict[str, Any], loc: str, message: str, podman: Podman, tmp_path: Path
) -> None:
    problems = _refused(tmp_path, _container(doc))
    assert [p for p in problems if p[0] == loc and p[1].startswith(message)] and len(problems) == 1, problems
    # Past validation: podman refuses the rendered command (--rootfs in the image's place).
    merged = _container(doc)
    merged.pop("extends")
    plan = launch.build(_past_validation(merged))
    words = [w.replace("${CREDENTIALS_DIRECTORY}", "/run/credentials/sglang.service") for w in plan.exec_argv]
    image = words.index(IMAGE)
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    created = podman(
        "create", *[w for w in words[2:image] if w != "-d"], "--rootfs", str(rootfs), *words[image + 1 :]
    )
    assert created.returncode != 0 and "duplicate mount destination" in created.stderr, created.stderr


def test_the_same_mounts_are_taken_where_the_unit_mounts_nothing_there(tmp_path: Path) -> None:
    """Without a cache, API key or tiers, those paths are the profile's to mount."""
    mounts = [
        {"source": "/srv/c", "target": CACHE, "read_only": False},
        {"source": "/srv/k.yaml", "target": KEY_FILE},
        {"source": "/srv/t.json", "target": TIERS_FILE},
    ]
    prof = _load(tmp_path, _container({"service": {"compile_cache": False}, "runtime": {"mounts": mounts}}))
    run = launch.build(prof).engine_argv
    assert {f"--volume={m['source']}:{m['target']}" in " ".join(run) for m in mounts} == {True}
    with pytest.raises(ProfileError):  # and the cache's path is taken again with the cache on
        _load(tmp_path, _container({"runtime": {"mounts": mounts[:1]}}))


# --- text systemd keeps, and text the YAML reader does not ------------------------------------------

#: (field, the YAML that sets it to the value, holding CHAR) for each field rendered into ExecStart= or
#: Environment=.
TEXT_FIELDS = [
    ("server.python", 'server: {python: "/opt/pyCHARx"}'),
    ("server.model_path", 'server: {model_path: "/data/mCHARx"}'),
    ("server.served_model_name", 'server: {served_model_name: "mCHARx"}'),
    ("server.extra_args[1]", 'server: {extra_args: ["--chat-template", "tCHARx"]}'),
    ("speculative.draft_model_path", 'speculative: {draft_model_path: "/data/dCHARx"}'),
    ("service.working_directory", 'service: {working_directory: "/srv/aCHARb"}'),
    ("env.A", 'env: {A: "aCHARb"}'),
    ("nccl.NCCL_DEBUG_FILE", 'nccl: {NCCL_DEBUG_FILE: "aCHARb"}'),
]
#: YAML 1.1's further line breaks (PyYAML's reader), their names and their double-quoted escapes.
BREAKS = [
    ("\x85", "U+0085 (NEL)", "\\N"),
    ("\u2028", "U+2028 (LINE SEPARATOR)", "\\L"),
    ("\u2029", "U+2029 (PARAGRAPH SEPARATOR)", "\\P"),
]


@pytest.mark.parametrize(("char", "named", "escape"), BREAKS, ids=["nel", "ls", "ps"])
def test_a_yaml11_line_break_written_as_is_is_refused_and_escaped_reaches_systemd_intact(
    char: str, named: str, escape: str, systemd: oracle.Systemd, tmp_path: Path
) -> None:
    """`env: {A: "a<NEL>b"}` reached the server as "a b". Written as \\N, it reaches it as "a<NEL>b":
    systemd keeps the character (its \\u0085 escape in the unit) in every field."""
    for loc, line in TEXT_FIELDS:
        text = f"extends: cg_5tok\n{line.replace('CHAR', char)}\n"
        [(where, message)] = _refused(tmp_path, text)
        column = line.index("CHAR") + 1
        assert where == loc and message.startswith(f"line 2, column {column}: {named} is written as is"), (
            message
        )
        assert f"write it as {escape} in a double-quoted string" in message
        prof = _load(tmp_path, f"extends: cg_5tok\n{line.replace('CHAR', escape)}\n")
        oracle.assert_reads_exactly(systemd, launch.build(prof), prof)
    # In a comment, it ended the comment: the rest was read as YAML.
    [(where, message)] = _refused(tmp_path, f"extends: cg_5tok\n# a note{char}env: {{A: b}}\n")
    assert where == "" and message.startswith(f"line 2, column 9: {named}"), message


#: Unicode noncharacters, each in YAML's escape (a raw U+FFFF is no YAML).
NONCHARACTERS = [
    ("\ufdd0", "\\uFDD0", "U+FDD0"),
    ("\uffff", "\\uFFFF", "U+FFFF"),
    ("\U0010ffff", "\\U0010FFFF", "U+10FFFF"),
]


@pytest.mark.parametrize(("char", "escape", "named"), NONCHARACTERS, ids=["fdd0", "ffff", "10ffff"])
def test_a_noncharacter_is_refused_where_systemd_refuses_the_line(
    char: str, escape: str, named: str, systemd: oracle.Systemd, tmp_path: Path
) -> None:
    for loc, line in TEXT_FIELDS:
        [(where, message)] = _refused(tmp_path, f"extends: cg_5tok\n{line.replace('CHAR', escape)}\n")
        assert where == loc and f"contains {named}, a Unicode noncharacter" in message, (loc, message)
        # Past validation: systemd drops the line, and the unit no longer loads or lacks the setting.
        doc = yaml.safe_load(line.replace("CHAR", escape))
        reading = systemd.read(launch.build(_past_validation(doc)).unit)
        assert any("not UTF-8 clean" in c for c in reading.complaints), (loc, reading.complaints)
