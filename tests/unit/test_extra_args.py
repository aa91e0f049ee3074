"""server.extra_args are read as SGLang's own argparse reads them (issue 13).

argparse takes any unique prefix of an option, `--opt=value` forms, and refuses a missing
value, a bad choice, an ambiguous prefix and a stray word. The parser is built from each
version's real --help (orchestrator/profile/sglang_help/), so Python's argparse does the resolving;
these tests hold the profile check to what that parser does with the whole command line.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from orchestrator.errors import ProfileError
from orchestrator.profile import model as profile_mod
from orchestrator.profile import sglang_flags, sglang_rules
from orchestrator.render import launch

VERSIONS = sglang_flags.SHIPPED
SECRET = "sk-SECRET-value"


def _messages(version: str, args: list[str]) -> list[str]:
    return [f"{loc}: {msg}" for loc, msg in sglang_rules.check_extra_args(version, args)]


# --- secrets -------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "args",
    [
        ["--api-key", SECRET],
        [f"--api-key={SECRET}"],
        ["--api-ke", SECRET],
        [f"--api-k={SECRET}"],
        ["--api", SECRET],
        ["--admin-api-key", SECRET],
        [f"--admin-api={SECRET}"],
        ["--admin", SECRET],
        ["--api-key", SECRET, "stray"],
        ["--api-k"],  # no value yet: still refused, as the fix is the same
    ],
    ids=repr,
)
def test_secret_flags_are_refused_by_any_spelling(version: str, args: list[str]) -> None:
    """Before issue 13 only the exact `--api-key` was caught: `--api-ke KEY` reached argv and the unit."""
    messages = _messages(version, args)
    assert len(messages) == 1, messages
    assert messages[0].startswith("server.extra_args[0]: ")
    assert "never put a secret inline" in messages[0]
    assert "api_key: {file: PATH} or {env: NAME}" in messages[0]
    assert SECRET not in messages[0]


def test_ssl_keyfile_password_is_a_secret_in_0523() -> None:
    (message,) = _messages("0.5.23", ["--ssl-keyfile-pass", SECRET])
    assert "--ssl-keyfile-password" in message and "never put a secret inline" in message


@pytest.mark.parametrize("version", VERSIONS)
def test_every_secret_option_of_the_help_is_guarded(version: str) -> None:
    """An option named like a key, password, secret or credential is in SECRET_FLAGS or is a path."""
    not_secret = {"--ssl-keyfile"}  # the path of the TLS key, not the key
    names = {n for o in sglang_flags.flag_table(version).all_options for n in o.names}
    secretish = {n for n in names if any(w in n for w in ("key", "password", "secret", "credential"))}
    assert secretish - not_secret <= set(sglang_flags.SECRET_FLAGS), secretish


def test_a_secret_prefix_fails_the_profile_and_is_never_rendered(tmp_path: Path) -> None:
    path = tmp_path / "p.yml"
    path.write_text(f"extends: cg_5tok\nserver: {{extra_args: ['--api-k={SECRET}']}}\n")
    with pytest.raises(ProfileError) as info:
        profile_mod.load(str(path))
    assert SECRET not in str(info.value)


# --- what argparse refuses -------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "args", "expected"),
    [
        (
            "0.5.9",
            ["--max-runing-requests", "8"],
            "[0]: --max-runing-requests is not a flag of SGLang 0.5.9; did you mean --max-running-requests?",
        ),
        (
            "0.5.23",
            ["--cuda-graph-max-bs=8"],
            "[0]: --cuda-graph-max-bs is ambiguous in SGLang 0.5.23 "
            "(--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill)",
        ),
        ("0.5.9", ["--enable-metric"], "[0]: --enable-metric is ambiguous"),
        (
            "0.5.9",
            ["--page-size"],
            "[0]: SGLang 0.5.9 would exit at start with: argument --page-size: expected one argument",
        ),
        ("0.5.9", ["--page-size", "x"], "invalid int value: 'x'"),
        ("0.5.23", ["--attention-backend", "flashinfr"], "invalid choice: 'flashinfr'"),
        ("0.5.9", ["--lora-target-modules", "q_proj", "nope"], "invalid choice: 'nope'"),
        ("0.5.9", ["--disable-radix-cache=1"], "ignored explicit argument '1'"),
        ("0.5.9", ["--max-running-requests", "8", "9"], "[2]: stray word '9'"),
        ("0.5.9", ["stray", "--disable-radix-cache"], "[0]: stray word 'stray'"),
        ("0.5.9", ["--max-running-requests 8"], "give a flag and its value as two items"),
        ("0.5.9", ["--", "--disable-radix-cache"], "[1]: stray word '--disable-radix-cache'"),
        ("0.5.9", ["--disable-radix-cache", "--"], "[1]: stray word '--'"),
        ("0.5.9", ["--help"], "[0]: --help prints SGLang's help and exits"),
        ("0.5.23", ["-h"], "[0]: -h prints SGLang's help and exits"),
        ("0.5.9", ["--he"], "[0]: --he (SGLang reads it as --help) prints"),
        # An option SGLang's help hides (help=SUPPRESS) still takes part in prefix matching.
        (
            "0.5.23",
            ["--forward-pass-metrics", "x"],
            "ambiguous in SGLang 0.5.23 (--forward-pass-metrics-ipc-name",
        ),
        ("0.5.23", ["--tp", "4"], "(SGLang reads it as --tp-size) duplicates a modelled setting"),
        ("0.5.9", ["--conf", "/x.yaml"], "(SGLang reads it as --config) duplicates a modelled setting"),
    ],
    ids=lambda v: repr(v)[:40],
)
def test_refused_as_argparse_refuses(version: str, args: list[str], expected: str) -> None:
    messages = _messages(version, args)
    assert any(expected in m for m in messages), messages


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--max-running-requests", "8"],
        ["--max-running=8"],
        ["--disable-radix"],
        ["--lora-paths", "a=/l/a", "b=/l/b", "--disable-radix-cache"],
        ["--uvicorn-access-log-exclude-prefixes"],
        ["--model-checksum"],
        ["--page-size", "-1"],
        ["--log-requests-level", "2"],
        ["--speculative-ngram-max-bfs-breadth=4"],
    ],
    ids=repr,
)
def test_accepted_as_argparse_accepts(version: str, args: list[str]) -> None:
    assert _messages(version, args) == []


# --- values of the type SGLang declares (issue 21) -----------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("args", "kind"),
    [
        (["--max-running-requests", "x"], "an integer (type=int): give a whole number"),
        (["--chunked-prefill-size", "1.5"], "an integer (type=int): give a whole number"),
        (["--chunked-prefill-size=8.0"], "an integer (type=int): give a whole number"),
        (["--schedule-conservativeness", "abc"], "a number (type=float): give a number"),
        # A modelled field, so never right in extra_args; a bad value says so by its type first.
        (["--mem-fraction-static", "abc"], "a number (type=float): give a number"),
        (["--watchdog-timeout", "5m"], "a number (type=float)"),
        (["--numa-node", "0", "x"], "an integer (type=int)"),  # nargs="+": each value converted
    ],
    ids=repr,
)
def test_a_value_sglang_would_not_convert_is_refused(version: str, args: list[str], kind: str) -> None:
    """Before issue 21 only six hand-picked flags had type=int: `--max-running-requests x` passed
    here and SGLang's argparse killed the server on the host, after the old one was stopped."""
    (message,) = _messages(version, args)
    flag, _, value = " ".join(args).replace("=", " ").partition(" ")
    value = value.split()[-1]
    assert message.startswith(f"server.extra_args[0]: SGLang {version} would exit at start with: ")
    assert f"argument {flag}: invalid " in message and f" value: {value!r}" in message
    assert f"; SGLang reads this flag's value as {kind}" in message
    assert "\n" not in message


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "args",
    [
        ["--max-running-requests", "8"],
        ["--max-running-requests", "-1"],
        ["--max-running-requests", "+8"],
        # What Python's int() takes, SGLang's argparse takes: underscores, blanks, other digits.
        ["--max-running-requests", "1_000"],
        ["--max-running-requests", " 7 "],
        ["--max-running-requests", "\u0663"],  # ARABIC-INDIC DIGIT THREE
        ["--chunked-prefill-size=-1"],
        ["--schedule-conservativeness", "0.3"],
        ["--schedule-conservativeness", "1e-3"],
        ["--schedule-conservativeness", "1"],
        ["--watchdog-timeout", " 600 "],
        ["--preferred-sampling-params", '{"temperature": 0}'],
    ],
    ids=repr,
)
def test_a_value_sglang_converts_is_accepted(version: str, args: list[str]) -> None:
    assert _messages(version, args) == []


def test_a_profile_with_a_value_sglang_would_not_convert_fails_to_load(tmp_path: Path) -> None:
    """Issue 21 as a user meets it: the profile is refused before anything on a host changes."""
    path = tmp_path / "p.yml"
    path.write_text("extends: cg_5tok\nserver: {extra_args: [--max-running-requests, x]}\n")
    with pytest.raises(ProfileError) as info:
        profile_mod.load(str(path))
    assert "server.extra_args[0]: " in str(info.value)
    assert "invalid int value: 'x'; SGLang reads this flag's value as an integer (type=int)" in str(
        info.value
    )


def test_values_are_read_as_sglang_converts_them() -> None:
    values = sglang_flags.option_values(
        "0.5.9", ["--max-running-requests", " 1_000 ", "--schedule-conservativeness", "0.5"]
    )
    assert values["--max-running-requests"] == 1000
    assert values["--schedule-conservativeness"] == 0.5


@pytest.mark.parametrize(
    ("version", "args", "expected"),
    [
        # 0.5.15 on: human_readable_int, whole numbers with SI or IEC suffixes.
        ("0.5.15", ["--max-total-tokens", "8k"], None),
        ("0.5.23", ["--max-total-tokens", "25.6k"], None),
        ("0.5.23", ["--max-total-tokens", " 2Ki "], None),
        ("0.5.23", ["--max-total-tokens", "1.5Ki"], "invalid human_readable_int value: '1.5Ki'"),
        ("0.5.23", ["--max-total-tokens", "8K"], "invalid human_readable_int value: '8K'"),
        ("0.5.23", ["--max-total-tokens", "x"], "type=human_readable_int): give a number such as 8192"),
        ("0.5.9", ["--max-total-tokens", "8k"], "invalid int value: '8k'"),  # a plain int in 0.5.9
        # json.loads and json_list_type: SGLang's own parse fails at start on text that is not JSON.
        ("0.5.9", ["--preferred-sampling-params", "{temperature: 0}"], "invalid loads value"),
        ("0.5.23", ["--preferred-sampling-params", "[" * 5000], "as JSON (type=json.loads)"),
        ("0.5.9", ["--forward-hooks", "[1,]"], "as a JSON list (type=json_list_type)"),
        ("0.5.9", ["--forward-hooks", "[]"], None),
    ],
    ids=lambda v: repr(v)[:40],
)
def test_sglang_converters_of_its_own(version: str, args: list[str], expected: str | None) -> None:
    messages = _messages(version, args)
    if expected is None:
        assert messages == []
    else:
        assert len(messages) == 1 and expected in messages[0], messages


def test_human_readable_int_reads_as_sglang_documents_it() -> None:
    read = sglang_flags.human_readable_int
    assert [read("1k"), read("1M"), read("25.6k"), read("1Ki"), read("1Mi"), read("7")] == [
        1000,
        1_000_000,
        25600,
        1024,
        1_048_576,
        7,
    ]
    for bad in ("1.5Ki", "1m", "k", "1 k", "1.5"):
        with pytest.raises(ValueError):
            read(bad)


# --- the check agrees with argparse on the whole command line ----------------------------

CROSS_CHECK = [
    ["--max-running-requests", "8"],
    ["--max-running", "8"],
    ["--max-runing-requests", "8"],
    ["--cuda-graph-max-bs", "8"],
    ["--cuda-graph-max-bs-d", "8"],
    ["--page-size"],
    ["--page-size", "x"],
    ["--page-size", "16", "16"],
    ["--attention-backend", "fa3"],
    ["--attention-backend", "fa33"],
    ["--schedule-policy=lpm"],
    ["--schedule-policy=nope"],
    ["--enable-mixed-chunk=yes"],
    ["--enable-mixed-chunk", "yes"],
    ["word"],
    ["--disable-radix-cache", "--"],
    ["--", "x"],
    ["-x"],
    ["--enable-metric"],
    ["--lora-paths"],
    ["--lora-paths", "a", "b"],
    ["--enable-dp-attention", "--moe-dense-tp-size", "1"],
    ["--max-running-requests", "x"],
    ["--max-running-requests", "1_000"],
    ["--chunked-prefill-size", "1.5"],
    ["--mem-fraction-static", "abc"],
    ["--cuda-graph-max-bs", "8.5"],
]


class _Refused(Exception):
    pass


@functools.cache
def _whole_line_parser(version: str) -> argparse.ArgumentParser:
    """SGLang's parser as the renderer's tests rebuild it, raising instead of exiting."""
    parser = sglang_flags.build_parser(sglang_flags.flag_table(version))

    def error(message: str) -> None:
        raise _Refused(message)

    parser.error = error  # type: ignore[method-assign]
    return parser


def _argparse_refuses(version: str, argv: list[str]) -> bool:
    try:
        _whole_line_parser(version).parse_args(argv)
    except _Refused:
        return True
    return False


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("extra", CROSS_CHECK, ids=repr)
def test_check_agrees_with_argparse_on_the_rendered_argv(
    version: str, extra: list[str], tmp_path: Path
) -> None:
    path = tmp_path / "p.yml"
    path.write_text(f"extends: cg_5tok\nserver: {{sglang_version: '{version}'}}\n")
    argv = launch.build(profile_mod.load(str(path))).argv[3:] + extra
    refused = _argparse_refuses(version, argv)
    policy = ("duplicates a modelled setting", "never put a secret inline", "prints SGLang's help")
    messages = [m for m in _messages(version, extra) if not any(p in m for p in policy)]
    assert refused == bool(messages), (refused, messages)


def _words(version: str) -> st.SearchStrategy[str]:
    names = sorted(
        {n for o in sglang_flags.flag_table(version).all_options for n in o.names} - {"-h", "--help"}
    )
    name = st.sampled_from(names)
    prefix = st.builds(lambda n, k: n[: max(3, len(n) - k)], name, st.integers(0, 30))
    value = st.sampled_from(["1", "-1", "x", "fa3", "flashinfer", "lpm", "", "a b", "--", "-", "-x"])
    return st.one_of(
        name,
        prefix,
        st.builds(lambda n, v: f"{n}={v}", prefix, value),
        value,
        st.builds(lambda n, v: f"{n} {v}", name, value),
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_check_agrees_with_argparse_on_random_words(version: str) -> None:
    """Random prefixes, `=` forms and values: the check fails exactly when argparse does."""
    base = ["--model-path", "/m"]

    @given(st.lists(_words(version), max_size=5))
    @settings(derandomize=True, database=None, max_examples=200, deadline=None)
    def check(extra: list[str]) -> None:
        messages = _messages(version, extra)
        assume(not any("never put a secret inline" in m for m in messages))  # reported alone, value or not
        policy = ("duplicates a modelled setting", "prints SGLang's help")
        messages = [m for m in messages if not any(p in m for p in policy)]
        assert _argparse_refuses(version, base + extra) == bool(messages), (extra, messages)

    check()


# --- values the rules read ---------------------------------------------------------------


def test_option_values_resolve_prefixes_under_every_spelling() -> None:
    values = sglang_flags.option_values(
        "0.5.23", ["--attn-dp", "4", "--pipeline-parallel=2", "--enable-dp-attention"]
    )
    assert values["--attn-dp-size"] == values["--attention-data-parallel-size"] == 4
    assert values["--pp-size"] == 2
    assert values["--enable-dp-attention"] is True


def test_option_values_skip_what_argparse_refuses() -> None:
    assert sglang_flags.option_values("0.5.9", ["--page-size", "x", "--pp-size"]) == {}


def test_fragment_parser_reports_instead_of_printing_help(capsys: pytest.CaptureFixture[str]) -> None:
    parser = sglang_flags.build_parser(sglang_flags.flag_table("0.5.9"), fragments=True)
    assert vars(parser.parse_args(["--help"])) == {"help": True}
    with pytest.raises(sglang_flags.ArgError, match="expected one argument"):
        parser.parse_args(["--page-size"])
    assert capsys.readouterr() == ("", "")
    assert isinstance(sglang_flags.build_parser(sglang_flags.flag_table("0.5.9")), argparse.ArgumentParser)


def test_spelled_flags_name_options_as_the_help_does() -> None:
    """For the host's preflight, which looks each flag up in that host's --help verbatim."""
    argv = ["--model-path", "/m", "--tp", "8", "--max-running=8", "--lora-paths", "--x", "--nope", "1"]
    assert sglang_flags.spelled_flags("0.5.9", argv) == [
        "--lora-paths",
        "--max-running-requests",
        "--model-path",
        "--nope",
        "--tp-size",
        "--x",
    ]
