"""A profile means what its text says (issue 21, classes 1 and 7): YAML 1.2 values, bounded input.

PyYAML's YAML 1.1 turned `env: {A: 1.10}` into 1.1, `010` into 8 and `12:30` into 750 before any
rule saw them. Each test writes the profile's text by hand (yaml.safe_dump would quote what
matters) and checks what the server would get: the plan's argv and environment, or a refusal
located at the field that names both readings.

The property tests walk every field of the Profile model, so a field added later is covered
without a test naming it: a number-like plain scalar put in any text field either is refused or
reaches the model as written; put in any number field, it either is refused or means the same
number to YAML 1.1 (Ansible, PyYAML) as it does here.
"""

from __future__ import annotations

import time
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from orchestrator.errors import InputError, ProfileError
from orchestrator.profile import model as profile_mod
from orchestrator.profile import yaml12
from orchestrator.render import launch

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp: Path, text: str) -> str:
    path = tmp / "p.yml"
    path.write_text(f"extends: {ROOT / 'profiles' / 'cg_5tok.yml'}\n{text}")
    return str(path)


def _problems(tmp: Path, text: str) -> list[str]:
    with pytest.raises(ProfileError) as info:
        profile_mod.load(_write(tmp, text))
    return [f"{p.loc}: {p.message}" for p in info.value.problems]


# --- text fields keep what was written ----------------------------------------------------------


def test_env_values_reach_the_server_as_written(tmp_path: Path) -> None:
    prof = profile_mod.load(
        _write(tmp_path, "env: {A: 1.10, B: 0x10, C: 010, D: 12:30, E: yes, F: 1_000, G: 1e3, H: .5}\n")
    )
    env = launch.build(prof).environment
    assert {k: env[k] for k in "ABCDEFGH"} == {
        "A": "1.10",
        "B": "0x10",
        "C": "010",
        "D": "12:30",
        "E": "yes",
        "F": "1_000",
        "G": "1e3",
        "H": ".5",
    }


def test_nccl_values_keep_their_text_and_integers_are_read_as_nccl_reads_them(tmp_path: Path) -> None:
    prof = profile_mod.load(_write(tmp_path, "nccl: {NCCL_BUFFSIZE: 0x400000, NCCL_DEBUG_FILE: 1.10}\n"))
    env = launch.build(prof).environment
    assert (env["NCCL_BUFFSIZE"], env["NCCL_DEBUG_FILE"]) == ("0x400000", "1.10")
    # NCCL reads integer variables with strtoll(base 0): 1.10 would run as 1, 010 as 8.
    found = _problems(tmp_path, "nccl: {NCCL_IB_TIMEOUT: 1.10, NCCL_BUFFSIZE: 010}\n")
    lines = dict(line.split(": ", 1) for line in found)
    assert lines == {
        "nccl.NCCL_IB_TIMEOUT": "'1.10' is not an integer: NCCL reads NCCL_IB_TIMEOUT with strtoll and "
        "would run with 1; write an integer",
        "nccl.NCCL_BUFFSIZE": "'010' is octal to NCCL (it reads NCCL_BUFFSIZE with strtoll, base 0): it "
        "would run as 8; write 8, or 10 without the leading zero if decimal was meant",
    }


def test_nccl_lists_with_spaces_are_refused(tmp_path: Path) -> None:
    """NCCL splits on ',' and compares whole tokens: 'LL, LL128' enables LL alone."""
    assert _problems(tmp_path, 'nccl: {NCCL_PROTO: "LL, LL128"}\n') == [
        "nccl.NCCL_PROTO: 'LL, LL128' has spaces around a name, which NCCL does not trim: write 'LL,LL128'"
    ]


def test_service_extra_keeps_an_octal_umask(tmp_path: Path) -> None:
    prof = profile_mod.load(_write(tmp_path, "service: {extra: {UMask: 0027}}\n"))
    assert "\nUMask=0027\n" in launch.build(prof).unit


def test_yaml11_booleans_are_text_and_restart_no_still_reads(tmp_path: Path) -> None:
    prof = profile_mod.load(_write(tmp_path, "service: {restart: no}\nenv: {A: on, B: off}\n"))
    assert prof.service.restart == "no"
    assert (prof.env["A"], prof.env["B"]) == ("on", "off")


def test_extra_args_numbers_keep_their_text(tmp_path: Path) -> None:
    prof = profile_mod.load(_write(tmp_path, "server: {extra_args: [--max-running-requests, 064]}\n"))
    assert launch.build(prof).argv[-2:] == ["--max-running-requests", "064"]


# --- number fields refuse a form with two readings ---------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "server: {port: 075}",
            "server.port: 075 has a leading zero: 75 in YAML 1.2 (as read here), 61 (octal) in YAML 1.1 "
            "(as Ansible and PyYAML read it); write 75, or 61 if the octal was meant",
        ),
        (
            "server: {port: 09}",
            "server.port: 09 has a leading zero: 9 in YAML 1.2 (as read here), the text '09' in YAML 1.1 "
            "(as Ansible and PyYAML read it); write 9",
        ),
        (
            "service: {health_timeout_s: 12:30}",
            "service.health_timeout_s: '12:30' is text in YAML 1.2 (as read here) but 750 (base 60) in "
            "YAML 1.1; write 750 if that is meant",
        ),
        (
            "server: {cuda_graph_max_bs: 1_024}",
            "server.cuda_graph_max_bs: '1_024' is text in YAML 1.2 (as read here) but 1024 in YAML 1.1; "
            "write 1024 if that is meant",
        ),
        ("server: {gpus: [00]}", "server.gpus.0: 00 has a leading zero"),
        ("service: {restart: on-failure, restart_sec: 010}", "service.restart_sec: 010 has a leading zero"),
    ],
)
def test_a_number_with_two_readings_is_refused_naming_both(tmp_path: Path, text: str, message: str) -> None:
    lines = _problems(tmp_path, text + "\n")
    assert len(lines) == 1 and lines[0].startswith(message), lines


def test_unambiguous_forms_are_read_as_yaml_12(tmp_path: Path) -> None:
    """Hex and 1.2 octal mean one number; `1e1` is a float in 1.2 (text to PyYAML, refused there)."""
    prof = profile_mod.load(_write(tmp_path, "server: {port: 0x7531, cuda_graph_max_bs: 0o20}\n"))
    assert (prof.server.port, prof.server.cuda_graph_max_bs) == (30001, 16)
    argv = launch.build(prof).argv
    assert argv[argv.index("--port") :][:2] == ["--port", "30001"]


def test_yaml_12_scalars() -> None:
    doc = "a: [1.10, 010, 0o10, 0x10, 12:30, yes, 1e3, .inf, -.Inf, ~, null, True, 2001-12-14, '010']"
    values = yaml12.Loader(doc.encode()).get_single_data()["a"]
    assert [type(v).__mro__[-3 if isinstance(v, bool) else -2].__name__ for v in values] == [
        "float", "int", "int", "int", "str", "str", "float", "float", "float",
        "NoneType", "NoneType", "bool", "str", "str",
    ]  # fmt: skip
    assert [str(v) for v in values[:7]] == ["1.10", "010", "0o10", "0x10", "12:30", "yes", "1e3"]
    assert [int(v) for v in values[1:4]] == [10, 8, 16]
    assert values[7] == float("inf") and values[8] == float("-inf")
    # What was read dumps as its YAML 1.2 meaning, which a YAML 1.1 reader takes the same way.
    assert yaml.safe_load(yaml.safe_dump(values[:7])) == [1.1, 10, 8, 16, "12:30", "yes", 1000.0]


def test_an_explicit_yaml_11_form_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "server: {port: !!int 0b101}\n")
    with pytest.raises(InputError, match=r"'0b101' is not a YAML 1.2 integer"):
        profile_mod.load(path)


# --- every field of the model --------------------------------------------------------------------


def _leaves(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], type]]:
    """(path, scalar type) of every int, float and str field, through nested sections."""
    for name, field in model.model_fields.items():
        for kind in _types(field.annotation):
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                yield from _leaves(kind, (*prefix, name))
            elif kind in (int, float, str):
                yield (*prefix, name), kind


def _types(annotation: Any) -> list[Any]:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _types(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in _types(arg)]
    if origin is typing.Literal or annotation is bool:
        return []
    return [annotation] if origin is None else []


LEAVES = sorted(set(_leaves(profile_mod.Profile)) - {(("name",), str), (("extends",), str)})
#: Mappings and lists of text, by a key or form that reaches the server.
CONTAINERS = [
    ("env", "A"),
    ("nccl", "NCCL_DEBUG_FILE"),
    ("nccl", "NCCL_IB_TIMEOUT"),
    ("service", "extra", "UMask"),
]

#: Plain scalars YAML 1.1 and 1.2 read differently, or alike, and whatever else.
number_like = st.one_of(
    st.from_regex(r"[-+]?0[0-9]{1,3}", fullmatch=True),
    st.from_regex(r"0x[0-9a-f]{1,4}|0o[0-7]{1,3}|0b[01]{1,4}", fullmatch=True),
    st.from_regex(r"[1-9]?[0-9]:[0-5][0-9](:[0-5][0-9])?", fullmatch=True),
    st.from_regex(r"[0-9]{1,3}\.[0-9]{0,3}|[0-9]e[0-9]|[0-9]{1,2}_[0-9]{3}|\.[0-9]", fullmatch=True),
    st.sampled_from(["yes", "no", "on", "off", "y", "n", "True", "~", "null", ".inf", ".nan", "2001-12-14"]),
    st.integers(-10, 70_000).map(str),
)


def test_every_field_is_walked() -> None:
    """The walk finds the fields this file is about (a broken walk would test nothing)."""
    paths = {".".join(path) for path, _ in LEAVES}
    assert {"server.port", "server.served_model_name", "service.restart_sec", "description"} <= paths
    assert {"runtime.image", "speculative.num_steps", "deployment.dist_init_port"} <= paths
    assert len(paths) > 30


def _nested(path: tuple[str, ...], text: str) -> str:
    """The YAML text of `path: text`, the value plain (unquoted), one level per key."""
    lines = [f"{'  ' * i}{key}:" for i, key in enumerate(path)]
    return "\n".join(lines) + f" {text}\n"


def _model_value(prof: profile_mod.Profile, path: tuple[str, ...]) -> Any:
    node: Any = prof
    for key in path:
        node = node[key] if isinstance(node, dict) else getattr(node, key)
    return node


@given(leaf=st.sampled_from(LEAVES + [(c, str) for c in CONTAINERS]), text=number_like)
@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
def test_a_plain_scalar_in_any_field_is_refused_or_means_what_both_yamls_say(
    leaf: tuple[tuple[str, ...], type], text: str, tmp_path: Path
) -> None:
    path, kind = leaf
    source = _nested(path, text)
    if path[:2] == ("service", "restart_sec"):
        source = "service:\n  restart: on-failure\n  restart_sec: " + text + "\n"
    try:
        prof = profile_mod.load(_write(tmp_path, source))
    except ProfileError as exc:
        assert all(p.message and "\n" not in p.message for p in exc.problems), exc.problems
        old = yaml12.yaml11_reading(text)
        if kind is not str and isinstance(old, (int, float)) and not isinstance(old, bool):
            new = yaml12.Loader(text.encode()).get_single_data()
            if old != new and new == new:  # two readings: the refusal names both
                assert any(p.loc == ".".join(path) and str(old).lower() in p.message for p in exc.problems)
        return
    if text in ("~", "null"):  # reset to the default (profile.merge), or dropped from a mapping
        return
    value = _model_value(prof, path)
    if kind is str:
        assert value == text, (path, text, value)
    elif value is not None:
        new, old = yaml12.Loader(text.encode()).get_single_data(), yaml12.yaml11_reading(text)
        assert value == new or value != value, f"{path}: {text} read as {value}, YAML 1.2 says {new}"
        assert not isinstance(old, (int, float)) or isinstance(old, bool) or old == value or value != value, (
            f"{'.'.join(path)}: {text} read as {value} here, {old} by YAML 1.1"
        )


# --- bounded before expanded (class 7) ------------------------------------------------------------


def test_a_huge_gpu_range_is_refused_before_it_is_expanded(tmp_path: Path) -> None:
    assert _problems(tmp_path, "server: {gpus: 0-999999999999}\n") == [
        "server.gpus: '0-999999999999' goes past GPU 63: nvidia-smi numbers a host's GPUs from 0"
    ]
    lines = _problems(tmp_path, f"server: {{gpus: '{','.join(['0-63'] * 1000)}'}}\n")
    assert lines and "lists over 64 GPUs" in lines[0]


def test_an_over_large_profile_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "big.yml"
    with path.open("w") as f:
        f.write("description: '")
        f.write("x" * (50 * 1024 * 1024))
        f.write("'\n")
    started = time.monotonic()
    with pytest.raises(InputError, match=r"big.yml: is over 1024 KiB; no profile comes near that"):
        profile_mod.load(str(path))
    took = time.monotonic() - started
    print(f"50 MB profile refused in {took:.3f} s")


def test_many_keys_are_refused_while_parsing(tmp_path: Path) -> None:
    """300,000 env keys took 21 s to refuse; the loader stops at its node bound (within the size bound)."""
    path = tmp_path / "keys.yml"
    path.write_text("env:\n" + "".join(f" K{i}: 1\n" for i in range(80_000)))
    started = time.monotonic()
    with pytest.raises(InputError, match=r"keys.yml: has over 10000 values"):
        profile_mod.load(str(path))
    print(f"80,000 keys ({path.stat().st_size} bytes) refused in {time.monotonic() - started:.3f} s")
