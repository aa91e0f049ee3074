"""#14 on the control machine: GPU sets, unit options and secrets as a profile states them.

Every bad value is a located profile error naming the fix, before any host is touched; a good
one renders what systemd and SGLang read (tests/unit/test_systemd_oracle.py has systemd's reading).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.errors import InputError, ProfileError
from orchestrator.hosts import playvars, secrets
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch


def load(tmp_path: Path, text: str) -> profile_mod.Profile:
    path = tmp_path / "p.yml"
    path.write_text(text)
    return profile_mod.load(str(path))


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ProfileError) as err:
        load(tmp_path, text)
    return [f"{p.loc}: {p.message}" for p in err.value.problems]


# --- GPU sets -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "gpus"),
    [
        ('"4-7"', [4, 5, 6, 7]),
        ("[4, 5, 6, 7]", [4, 5, 6, 7]),
        ('"0-1,6,7"', [0, 1, 6, 7]),
        ('"7,6,5,4"', [7, 6, 5, 4]),
    ],
)
def test_gpu_set_spellings(tmp_path: Path, written: str, gpus: list[int]) -> None:
    prof = load(tmp_path, f"extends: cg_5tok\nserver: {{tp_size: 4, gpus: {written}}}\n")
    assert prof.server.gpus == gpus
    p = launch.build(prof)
    # nvidia-smi's indexes, in the order the server numbers them (its GPU 0 is the first listed).
    assert p.environment["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, gpus))
    assert next(iter(p.environment)) == "CUDA_VISIBLE_DEVICES"
    assert playvars.unit_facts(prof).gpus == gpus


def test_no_gpu_set_keeps_the_first_gpus_and_no_cuda_visible_devices(tmp_path: Path) -> None:
    prof = load(tmp_path, "extends: cg_5tok\nserver: {tp_size: 4}\n")
    assert "CUDA_VISIBLE_DEVICES" not in launch.build(prof).environment
    assert playvars.unit_facts(prof).gpus == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ('"4-7"', "lists 4 GPUs, but TP x DP needs 8"),
        ('"7-4"', "counts down: write 4-7"),
        ('"4-7,5"', "GPU 5 is listed twice"),
        ('"gpu4"', "is not a GPU list"),
        ("[0, 64, 2, 3, 4, 5, 6, 7]", "less than or equal to 63"),
        ("[true, 1, 2, 3, 4, 5, 6, 7]", "valid integer"),
        ("[]", "at least 1"),
    ],
)
def test_bad_gpu_sets_are_located_errors(tmp_path: Path, written: str, expected: str) -> None:
    found = problems(tmp_path, f"extends: cg_5tok\nserver: {{gpus: {written}}}\n")
    assert any(f.startswith("server.gpus") and expected in f for f in found), found


def test_tp_times_dp_with_dp_attention_counts_the_tp_group(tmp_path: Path) -> None:
    server = "{tp_size: 4, dp_size: 2, gpus: '0-3', extra_args: [--enable-dp-attention]}"
    text = f"extends: cg_5tok\nserver: {server}\n"
    assert load(tmp_path, text).server.gpus == [0, 1, 2, 3]
    found = problems(tmp_path, "extends: cg_5tok\nserver: {tp_size: 4, dp_size: 2, gpus: '0-3'}\n")
    assert found == [
        "server.gpus: lists 4 GPUs, but TP x DP needs 8 (tp_size x dp_size, or tp_size alone "
        "with DP attention): list 8 GPUs or change tp_size/dp_size"
    ]


def test_cuda_visible_devices_under_env_names_server_gpus(tmp_path: Path) -> None:
    found = problems(tmp_path, "extends: cg_5tok\nenv: {CUDA_VISIBLE_DEVICES: '4,5,6,7'}\n")
    assert len(found) == 1 and found[0].startswith("env.CUDA_VISIBLE_DEVICES: set the GPUs with server.gpus")


def test_multinode_gpu_set_is_each_nodes_share(tmp_path: Path) -> None:
    text = "extends: cg_5tok_2node\nserver: {gpus: '4-7', tp_size: 8}\n"
    prof = load(tmp_path, text)
    hosts = [
        playvars.inventory_mod.InventoryHost(name=f"n{i}", address=f"10.0.0.{i}", deployment=None)
        for i in range(4)
    ]
    assert playvars._ranks(prof, hosts[:2]) == hosts[:2]
    with pytest.raises(
        InputError, match=r"server\.gpus lists 4 GPUs per node; 4 nodes x 4 is not the 8 GPUs"
    ):
        playvars._ranks(prof, hosts)


# --- unit options -----------------------------------------------------------------------------


def test_defaults_lock_memory_without_limit_and_do_not_restart(tmp_path: Path) -> None:
    unit = launch.build(profile_mod.load("cg_5tok")).unit
    assert "\nLimitMEMLOCK=infinity\n" in unit and "\nLimitNOFILE=1048576\n" in unit
    assert "\nRestart=no\n" in unit and "RestartSec" not in unit and "StartLimit" not in unit


def test_restart_on_failure_renders_a_bounded_restart(tmp_path: Path) -> None:
    prof = load(
        tmp_path, "extends: cg_5tok\nservice: {restart: on-failure, restart_sec: 2.5, start_limit_burst: 5}\n"
    )
    unit = launch.build(prof).unit
    assert "\nRestart=on-failure\nRestartSec=2.5\n" in unit
    unit_section = unit.split("[Service]")[0]
    assert "\nStartLimitIntervalSec=3600\nStartLimitBurst=5\n" in unit_section


def test_bare_yaml_no_is_the_policy_no(tmp_path: Path) -> None:
    assert load(tmp_path, "extends: cg_5tok\nservice: {restart: no}\n").service.restart == "no"
    found = problems(tmp_path, "extends: cg_5tok\nservice: {restart: yes}\n")
    assert found and found[0].startswith("service.restart:")
    found = problems(tmp_path, "extends: cg_5tok\nservice: {restart_sec: 5}\n")
    assert found == [
        "service.restart_sec: takes effect only with service.restart: on-failure; set that or drop it"
    ]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"CPUAffinity": "0-31\nExecStartPre=/bin/rm -rf /"}, "one value on one line"),
        ({"Nice": "-5 OOMScoreAdjust=-1000"}, "without '='"),
        ({"Nice": 20}, "not an integer from -20 to 19"),
        ({"ExecStartPre": "/bin/true"}, "not a directive service.extra allows"),
        ({"User": "nobody"}, "User is set by service.user"),
        ({"LimitMEMLOCK": "64G"}, "set by service.limits.memlock"),
        ({"IOSchedulingClass": "fast"}, "is not realtime, best-effort, idle or none"),
    ],
)
def test_extra_directives_come_from_an_allow_list(tmp_path: Path, extra: dict, expected: str) -> None:
    text = yaml.safe_dump({"extends": "cg_5tok", "service": {"extra": extra}})
    found = problems(tmp_path, text)
    assert any(f.startswith("service: extra: ") and expected in f for f in found), found


def test_allowed_extra_directives_render_as_written(tmp_path: Path) -> None:
    prof = load(
        tmp_path,
        "extends: cg_5tok\n"
        "service: {extra: {CPUAffinity: '0-31', Nice: -5, NUMAPolicy: bind, NUMAMask: '0'}}\n",
    )
    assert "\nCPUAffinity=0-31\nNice=-5\nNUMAPolicy=bind\nNUMAMask=0\n" in launch.build(prof).unit


@pytest.mark.parametrize(("value", "ok"), [("infinity", True), (65536, True), ("64G", True), ("lots", False)])
def test_limits(tmp_path: Path, value: object, ok: bool) -> None:
    text = yaml.safe_dump({"extends": "cg_5tok", "service": {"limits": {"memlock": value}}})
    if ok:
        assert f"\nLimitMEMLOCK={value}\n" in launch.build(load(tmp_path, text)).unit
    else:
        assert any("service.limits.memlock" in f and "is not a size" in f for f in problems(tmp_path, text))


# --- secrets ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "hf_token"]
)
def test_secret_looking_names_under_env_say_where_they_belong(tmp_path: Path, name: str) -> None:
    found = problems(tmp_path, f"extends: cg_5tok\nenv: {{{name}: x}}\n")
    assert len(found) == 1
    assert (
        found[0].startswith(f"env.{name}: looks like a secret")
        and f"secret_env: {{{name}: {{env: {name}}}}}" in found[0]
    )


def test_secret_env_never_reaches_the_unit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", 'hf_a"b$c`d\\e')
    prof = load(
        tmp_path, "extends: cg_5tok\nservice: {user: sglang}\nsecret_env: {HF_TOKEN: {env: HF_TOKEN}}\n"
    )
    p = launch.build(prof)
    assert "hf_a" not in p.unit and "HF_TOKEN" not in p.unit
    assert "\nEnvironmentFile=/etc/orchestrator/sglang.env\n" in p.unit
    host = playvars.for_profile(prof, p, playvars.unit_facts(prof))
    assert (host.env_file_path, host.service_user) == ("/etc/orchestrator/sglang.env", "sglang")
    # systemd's load_env_file() reads `\\`, `\"`, `\``, `\$` inside double quotes as the character.
    assert secrets.secret_env_text(prof) == 'HF_TOKEN="hf_a\\"b\\$c\\`d\\\\e"\n'
    bundle = json.loads(secrets.secret_bundle(prof))
    assert bundle == {"config": "", "env": secrets.secret_env_text(prof), "api_key": ""}
    assert secrets.secret_env_names(prof) == ["HF_TOKEN"]


def test_secret_env_unset_on_this_machine_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    prof = load(tmp_path, "extends: cg_5tok\nsecret_env: {HF_TOKEN: {env: HF_TOKEN}}\n")
    with pytest.raises(InputError, match=r"secret_env.HF_TOKEN.env: \$HF_TOKEN is not set on this machine"):
        secrets.secret_bundle(prof)


def test_secret_env_may_not_repeat_env(tmp_path: Path) -> None:
    found = problems(tmp_path, "extends: cg_5tok\nenv: {HF_HOME: /x}\nsecret_env: {HF_HOME: {env: X}}\n")
    assert found == ["secret_env.HF_HOME: also set under env:; keep it in one place"]


def test_environment_files_are_checked_and_copied(tmp_path: Path) -> None:
    env = tmp_path / "site.env"
    env.write_text("# site settings\nHF_HUB_OFFLINE=1\n  TRANSFORMERS_CACHE = /data/cache\n")
    env.chmod(0o600)
    prof = load(tmp_path, f"extends: cg_5tok\nservice: {{environment_files: [{env}]}}\n")
    assert secrets.secret_env_text(prof) == env.read_text()
    env.chmod(0o602)  # the same checks as an API key file (tests/unit/test_secrets.py)
    with pytest.raises(InputError, match="can be written by any user on this machine: chmod o-w"):
        secrets.secret_env_text(prof)
    env.chmod(0o600)
    env.write_text("HF_HUB_OFFLINE 1\n")
    with pytest.raises(InputError, match="line 1 is not NAME=value"):
        secrets.secret_env_text(prof)
    env.write_text("NCCL_ALGO=Tree\n")
    with pytest.raises(InputError, match="line 1: NCCL_ALGO is also set by the profile"):
        secrets.secret_env_text(prof)
    # systemd's parser knows no `export`: the name is "export A", which it drops (test_systemd_oracle).
    env.write_text("HF_HUB_OFFLINE=1\nexport TRANSFORMERS_CACHE=/data/cache\n")
    with pytest.raises(InputError, match="line 2: 'export TRANSFORMERS_CACHE' is not a valid environment"):
        secrets.secret_env_text(prof)
    env.write_text("CREDENTIALS_DIRECTORY=/tmp\n")
    with pytest.raises(InputError, match="line 1: CREDENTIALS_DIRECTORY cannot be set here: systemd sets it"):
        secrets.secret_env_text(prof)


def test_api_key_for_a_non_root_user_is_a_credential(tmp_path: Path) -> None:
    prof = load(tmp_path, "extends: cg_5tok\nservice: {user: sglang}\napi_key: {env: K}\n")
    unit = launch.build(prof).unit
    assert "\nLoadCredential=sglang-config.yaml:/etc/orchestrator/sglang.config.yaml\n" in unit
    assert "--config ${CREDENTIALS_DIRECTORY}/sglang-config.yaml\n" in unit


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('A="one', 'a " is not closed'),
        ("A='one", "a ' is not closed"),
        ('A="x" "y', 'a " is not closed'),
        ("A=one\\", "it ends in a backslash"),
    ],
)
def test_an_environment_file_value_left_open_is_refused(tmp_path: Path, line: str, problem: str) -> None:
    """#21: systemd reads an open quote (or a trailing backslash) on into the next line: B=2 below would
    be part of A's value, and B unset. Closed quotes and escaped quotes read on one line are fine."""
    env = tmp_path / "site.env"
    env.write_text(f"{line}\nB=2\n")
    env.chmod(0o600)
    prof = load(tmp_path, f"extends: cg_5tok\nservice: {{environment_files: [{env}]}}\n")
    with pytest.raises(InputError, match=rf"line 1: {problem}, so systemd would read the next line into A's"):
        secrets.secret_env_text(prof)
    env.write_text('A="a \\" b"\nC=\'x " y\'\nD=e\\ f\nB=2\n')
    assert secrets.secret_env_text(prof) == env.read_text()


def test_environment_files_set_each_name_once_and_no_nccl_variable(tmp_path: Path) -> None:
    """#21 (review): systemd keeps the last of two assignments, silently; NCCL variables there skipped
    the nccl: checks (NCCL_IB_TIMEOUT=1.10 runs as 1), and PYTHONUNBUFFERED overrode the unit's own."""
    one, two = tmp_path / "one.env", tmp_path / "two.env"
    for f in (one, two):
        f.write_text("A=1\n")
        f.chmod(0o600)
    prof = load(tmp_path, f"extends: cg_5tok\nservice: {{environment_files: [{one}, {two}]}}\n")
    with pytest.raises(
        InputError,
        match=r"environment_files\[1\]: .*line 1: A is set again \(first at "
        r"service.environment_files\[0\] line 1\), and systemd keeps the last",
    ):
        secrets.secret_env_text(prof)
    two.write_text("NCCL_IB_TIMEOUT=1.10\n")
    with pytest.raises(InputError, match=r"line 1: set NCCL_IB_TIMEOUT under nccl:, where it is checked"):
        secrets.secret_env_text(prof)
    two.write_text("PYTHONUNBUFFERED=0\n")
    with pytest.raises(InputError, match=r"line 1: PYTHONUNBUFFERED is also set by the profile"):
        secrets.secret_env_text(prof)
