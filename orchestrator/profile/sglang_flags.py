"""SGLang's flags per version, read from the real `launch_server --help` text.

The help files in `sglang_help/` are the ground truth for which flags a version accepts. This module
is standard-library only on purpose. The lab copies it to its hosts, where the SGLang stand-in builds
its argparse parser from the same text. So the stand-in accepts exactly what the real server accepts.

`read_args` resolves a list of extra flags the way SGLang's own argparse parser does: unique
prefixes, `=` forms, values, choices, stray words. Python's argparse does the work. So a profile can
be checked on the control machine, rather than fail on a host.

The help text shows no types. So beside each help is a table of the `type=` SGLang converts each
option's value with (`launch_server-types-<version>.json`). scripts/sglang_types.py reads those
types from SGLang's source. So argparse refuses `--max-running-requests x` here, as it does there.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

HELP_DIR = Path(__file__).resolve().parent / "sglang_help"
_HELP_PREFIX = "launch_server-help-"
_TYPES_PREFIX = "launch_server-types-"

#: A release number as SGLang's tags spell them: 0.5.9, 0.5.10.post1.
_RELEASE = re.compile(r"(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?")

#: The oldest SGLang a profile may name: the oldest --help shipped, the first one read.
OLDEST = "0.5.9"


def version_key(version: str) -> tuple[int, int, int, int]:
    """A release number, comparable: 0.5.9 < 0.5.10 < 0.5.10.post1 < 0.5.11. ValueError if malformed."""
    match = _RELEASE.fullmatch(version)
    if match is None:
        raise ValueError(f"{version!r} is not an SGLang release number such as 0.5.9 or 0.5.10.post1")
    major, minor, patch, post = match.groups()
    return int(major), int(minor), int(patch), -1 if post is None else int(post)


def _shipped() -> tuple[str, ...]:
    names = (p.name[len(_HELP_PREFIX) : -len(".txt")] for p in HELP_DIR.glob(f"{_HELP_PREFIX}*.txt"))
    return tuple(sorted((v for v in names if _RELEASE.fullmatch(v)), key=version_key))


#: SGLang versions whose real --help ships in sglang_help/ (scripts/sglang_help.py makes them),
#: oldest first. A profile may name any release from OLDEST on: its flags are read from the
#: nearest of these at or below it (help_version).
SHIPPED = _shipped()


def version_problem(version: str) -> str | None:
    """Why a profile may not name `version`, or None when it may."""
    try:
        key = version_key(version)
    except ValueError as exc:
        return str(exc)
    if key < version_key(OLDEST):
        return (
            f"SGLang {version} is older than {OLDEST}, the oldest release orchestrator renders flags for; "
            f"name {OLDEST} or later"
        )
    return None


@cache
def help_version(version: str) -> str:
    """The shipped --help whose flags are rendered for SGLang `version`: the nearest at or below it."""
    problem = version_problem(version)
    if problem:
        raise KeyError(problem)
    return at_or_below({v: v for v in SHIPPED}, version)


def at_or_below(by_version: dict[str, T], version: str) -> T:
    """The value of the highest version key at or below `version`: what holds from that release on."""
    key = version_key(version)
    fitting = [v for v in by_version if version_key(v) <= key]
    if not fitting:
        raise KeyError(f"nothing known for SGLang {version} (from {min(by_version, key=version_key)} on)")
    return by_version[max(fitting, key=version_key)]


def help_note(version: str) -> str | None:
    """What `render` says when SGLang `version` has no shipped --help of its own."""
    used = help_version(version)
    if used == version:
        return None
    return (
        f"SGLang {version} has no shipped --help; flags are spelled from {used}'s, and preflight "
        "checks them against the host's own --help"
    )


def named(version: str) -> str:
    """SGLang `version` in a message that a --help text decides: with the help read, if another's."""
    used = help_version(version)
    return f"SGLang {version}" if used == version else f"SGLang {version} (read with {used}'s --help)"


#: Options argparse marks as required in the usage line of every shipped version.
_REQUIRED = {"--model-path"}

_ENTRY = re.compile(r"^  (-\S.*?)(?:\s{2,}\S.*)?$")

#: Options whose value is a secret: on argv every local user reads it (/proc/PID/cmdline), and
#: in the unit file every local user reads it too. Every option of the shipped help texts whose
#: name says key, password, secret or credential is here or is a path (`--ssl-keyfile`).
SECRET_FLAGS = ("--api-key", "--admin-api-key", "--ssl-keyfile-password")

#: SGLang's `type=` converters, by the name the types files give them (scripts/sglang_types.py),
#: that a check here applies as SGLang does; each with what a refusal means, and its fix. The
#: others ("str" or none, nullable_str, parse_cuda_graph_config_arg, ...) take the words as text.
VALUE_KINDS = {
    "int": "an integer (type=int): give a whole number such as 8",
    "float": "a number (type=float): give a number such as 0.85",
    "human_readable_int": (
        "an integer with an optional suffix k, M, G, T (decimals allowed) or Ki, Mi, Gi, Ti "
        "(type=human_readable_int): give a number such as 8192, 8k or 8Ki"
    ),
    "json.loads": "JSON (type=json.loads): give one JSON text, such as '{\"key\": 1}'",
    "json_list_type": "a JSON list (type=json_list_type): give one JSON text, such as '[1, 2]'",
}


def human_readable_int(value: str) -> int:
    """SGLang's human_readable_int (0.5.15 on): a whole number, or one with an SI suffix (k, M, G, T;
    `25.6k` is 25600) or an IEC suffix (Ki, Mi, Gi, Ti; no decimals); suffixes are case-sensitive.
    ValueError otherwise, so argparse says `invalid human_readable_int value: 'x'`."""
    text = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", text)
    if match is None:
        return int(text)
    number, suffix = match.groups()
    if suffix.endswith("i") and "." in number:
        raise ValueError(f"decimals with the IEC suffix {suffix}")
    scale = {
        "k": 10**3,
        "M": 10**6,
        "G": 10**9,
        "T": 10**12,
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
    }
    return int(Decimal(number) * scale[suffix])


def loads(value: str) -> Any:
    """SGLang's json.loads, under its name (argparse says `invalid loads value: '{x'` as there);
    JSON nested past Python's recursion limit is refused too, as it kills SGLang at start."""
    try:
        return json.loads(value)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def json_list_type(value: str) -> Any:
    """SGLang's json_list_type parses with orjson, which refuses all that json.loads refuses (and
    more: NaN, numbers out of range, lone surrogates), so this refuses nothing SGLang takes."""
    return loads(value)


_CONVERTERS: dict[str, Callable[[str], Any]] = {
    "int": int,  # argparse semantics, as SGLang's: ' 7 ', '1_000' and other digits pass
    "float": float,
    "human_readable_int": human_readable_int,
    "json.loads": loads,
    "json_list_type": json_list_type,
}


@dataclass(frozen=True)
class OptionSpec:
    """One option of the help text: its spellings and the shape of its value."""

    names: tuple[str, ...]
    nargs: str | None  # None: a bare switch; "1", "?", "+", "*": how many values
    choices: tuple[str, ...] = ()
    metavar: str = ""

    @property
    def dest(self) -> str:
        return self.names[0].lstrip("-").replace("-", "_")


@dataclass
class FlagTable:
    """All options of one SGLang version, and the `type=` SGLang reads each one's value with."""

    version: str
    options: list[OptionSpec] = field(default_factory=list)
    #: option (every spelling) -> the name of SGLang's `type=` for its value, None where it gives
    #: none: the version's types file (read_types). Empty: values are taken as text.
    types: dict[str, str | None] = field(default_factory=dict)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(n for o in self.options for n in o.names)

    def option(self, name: str) -> OptionSpec | None:
        for opt in self.all_options:
            if name in opt.names:
                return opt
        return None

    @property
    def all_options(self) -> list[OptionSpec]:
        """The options of the help text and those SGLang hides from it (see HIDDEN)."""
        return [*self.options, *HIDDEN.get(self.version, ())]


#: Options SGLang's parser takes but its --help hides (`help=argparse.SUPPRESS`). argparse
#: matches prefixes against them too, so `--forward-pass-metrics` is ambiguous in 0.5.23.
#: Found by building SGLang's own parser from each wheel's server_args and comparing (scripts/
#: sglang_help.py lists them): 0.5.23, arg_groups/fields/observability.py (forward_pass_metrics_worker_id,
#: forward_pass_metrics_ipc_name; 0.5.20 too); 0.5.15, server_args.py (the same two, and the
#: deprecated alias --speculative-dflash-draft-window-size of --speculative-draft-window-size).
HIDDEN: dict[str, tuple[OptionSpec, ...]] = {
    "0.5.15": (
        OptionSpec(("--forward-pass-metrics-worker-id",), "1", metavar="FORWARD_PASS_METRICS_WORKER_ID"),
        OptionSpec(("--forward-pass-metrics-ipc-name",), "1", metavar="FORWARD_PASS_METRICS_IPC_NAME"),
        OptionSpec(("--speculative-dflash-draft-window-size",), "1", metavar="SPECULATIVE_DRAFT_WINDOW_SIZE"),
    ),
    "0.5.20": (
        OptionSpec(("--forward-pass-metrics-worker-id",), "1", metavar="FORWARD_PASS_METRICS_WORKER_ID"),
        OptionSpec(("--forward-pass-metrics-ipc-name",), "1", metavar="FORWARD_PASS_METRICS_IPC_NAME"),
    ),
    "0.5.23": (
        OptionSpec(("--forward-pass-metrics-worker-id",), "1", metavar="FORWARD_PASS_METRICS_WORKER_ID"),
        OptionSpec(("--forward-pass-metrics-ipc-name",), "1", metavar="FORWARD_PASS_METRICS_IPC_NAME"),
    ),
}


def _parse_invocation(invocation: str) -> OptionSpec:
    names: list[str] = []
    nargs: str | None = None
    choices: tuple[str, ...] = ()
    metavar = ""
    for part in invocation.split(", "):
        name, _, rest = part.partition(" ")
        names.append(name)
        rest = rest.strip()
        if not rest:
            continue
        metavar = rest
        listed = re.search(r"\{([^{}]*)\}", rest)  # `{a,b}`, `[{a,b} ...]`, `{a,b} [{a,b} ...]`
        choices = tuple(listed.group(1).split(",")) if listed else ()
        if rest.startswith("{") and rest.endswith("}"):
            nargs = "1"
        elif rest.startswith("[") and rest.endswith(" ...]"):
            nargs = "*"
        elif rest.endswith(" ...]"):
            nargs = "+"
        elif rest.startswith("["):
            nargs = "?"
        else:
            nargs = "1"
    return OptionSpec(tuple(names), nargs, choices, metavar)


def parse_help(text: str) -> list[OptionSpec]:
    """Read the `options:` section of an argparse help text into option specs."""
    lines = text.splitlines()
    try:
        start = lines.index("options:") + 1
    except ValueError:
        raise ValueError("not an argparse help text: no 'options:' section") from None
    specs = []
    for line in lines[start:]:
        match = _ENTRY.match(line)
        if match:
            specs.append(_parse_invocation(match.group(1).strip()))
    return specs


def help_path(version: str) -> Path:
    return HELP_DIR / f"{_HELP_PREFIX}{version}.txt"


def types_path(version: str) -> Path:
    """The types of the options of a shipped help, beside it (made by scripts/sglang_types.py)."""
    return HELP_DIR / f"{_TYPES_PREFIX}{version}.json"


def read_types(path: Path) -> dict[str, str | None]:
    """A types file: option -> the name of SGLang's `type=` for its value (None: none given)."""
    return json.loads(path.read_text())["types"]


def flag_table(version: str) -> FlagTable:
    """The options SGLang `version` is taken to have: those of its nearest shipped help at or
    below it (the table's `version` names that help)."""
    return _table(help_version(version))


@cache
def _table(shipped: str) -> FlagTable:
    return FlagTable(shipped, parse_help(help_path(shipped).read_text()), read_types(types_path(shipped)))


class ArgError(Exception):
    """argparse's message for words it refuses (what SGLang prints before exiting 2)."""


class _RaisingParser(argparse.ArgumentParser):
    """Raises ArgError where argparse would print usage and exit."""

    def error(self, message: str) -> Any:
        raise ArgError(message)

    def exit(self, status: int = 0, message: str | None = None) -> Any:
        raise ArgError(message or f"exit {status}")


def build_parser(
    table: FlagTable,
    prog: str = "python -m sglang.launch_server",
    *,
    fragments: bool = False,
    raising: bool = False,
) -> argparse.ArgumentParser:
    """An argparse parser accepting exactly the options of `table`, as SGLang's own does.

    With `fragments`, the parser reads a piece of a command line for checking: nothing is
    required, the namespace holds only what the words set, `--help` is a plain switch (so it
    is reported, not printed), and an error raises ArgError instead of exiting.

    With `raising`, it reads a whole command line as SGLang does (--model-path required, every
    option in the namespace), but as `fragments` an error raises ArgError and `--help` is a switch.
    """
    if fragments:
        parser: argparse.ArgumentParser = _RaisingParser(
            prog=prog, add_help=False, argument_default=argparse.SUPPRESS
        )
    elif raising:
        parser = _RaisingParser(prog=prog, add_help=False)
    else:
        parser = argparse.ArgumentParser(prog=prog, add_help=False)
    for opt in table.all_options:
        if opt.names == ("-h", "--help"):
            if fragments or raising:
                parser.add_argument(*opt.names, action="store_true", dest="help")
            else:
                parser.add_argument(*opt.names, action="help", help="show this help message and exit")
            continue
        kwargs: dict = {"dest": opt.dest}
        if opt.nargs is None:
            no_form = [n for n in opt.names if n.startswith("--no-")]
            if no_form:
                names = [n for n in opt.names if not n.startswith("--no-")]
                parser.add_argument(*names, action=argparse.BooleanOptionalAction, dest=opt.dest)
                continue
            kwargs["action"] = "store_true"
        else:
            kwargs.update(_value_kwargs(opt, table.types))
        if _REQUIRED.intersection(opt.names) and not fragments:
            kwargs["required"] = True
        parser.add_argument(*opt.names, **kwargs)
    return parser


def _value_kwargs(opt: OptionSpec, types: dict[str, str | None]) -> dict[str, Any]:
    """nargs and choices of an option that takes values, as the help shows them, and the type
    SGLang converts each value with (`types`), so argparse refuses what SGLang's refuses."""
    kwargs: dict[str, Any] = {}
    if opt.nargs != "1":
        kwargs["nargs"] = opt.nargs
    convert = _CONVERTERS.get(types.get(opt.names[0]) or "")
    if convert is not None:
        kwargs["type"] = convert
    if opt.choices and convert in (int, float):
        # argparse checks a choice after converting it: `--log-requests-level {0,1,2,3}` is
        # type=int in SGLang, so "01" is 1 there.
        kwargs["choices"] = [kwargs["type"](c) for c in opt.choices]
    elif opt.choices:
        kwargs["choices"] = list(opt.choices)
    elif opt.metavar and not opt.metavar.startswith("["):
        kwargs["metavar"] = opt.metavar.split(" ")[0]
    return kwargs


def value_kind(version: str, arg: ExtraArg) -> str | None:
    """How SGLang reads the value argparse refused in `arg`, and the fix, when its type refused it
    ("an integer (type=int): give a whole number such as 8"); None for other refusals."""
    if arg.option is None or arg.error is None or not re.search(r": invalid \S+ value: ", arg.error):
        return None
    return VALUE_KINDS.get(flag_table(version).types.get(arg.option.names[0]) or "")


# --- Reading extra flags as SGLang would --------------------------------------------


@dataclass(frozen=True)
class ExtraArg:
    """One option (with its values) of a list of extra flags, as SGLang's argparse reads it."""

    index: int  # position of its first word in the list
    words: tuple[str, ...]
    option: OptionSpec | None = None  # what argparse resolved the first word to
    value: Any = None  # the parsed value: True for a switch, a list for nargs + and *
    error: str | None = None  # argparse's message when it refuses these words
    unknown: bool = False  # the first word is an option SGLang does not have
    stray: tuple[int, ...] = ()  # positions of words argparse would not take

    @property
    def name(self) -> str:
        """The first word as the user spelled the option, without any `=VALUE`."""
        return self.words[0].split("=", 1)[0]


#: argparse's own test for a negative number, which it reads as a value, not an option.
_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")


def read_args(version: str, args: list[str]) -> list[ExtraArg]:
    """Each option of `args` (words as they follow SGLang's other flags) as SGLang reads it.

    The words are cut where argparse sees an option start, and each piece is parsed by a
    parser built from that version's help, so Python's argparse itself resolves prefixes,
    `=` forms, values and choices; a piece that fails fails as it would on the host.
    """
    table = flag_table(version)
    parser = _fragment_parser(version)
    names = frozenset(n for o in table.all_options for n in o.names)
    return [_read_piece(parser, table, start, words) for start, words in _pieces(args, names)]


def option_values(version: str, args: list[str]) -> dict[str, Any]:
    """The value of every option `args` set cleanly, under each of its spellings (last one wins)."""
    values: dict[str, Any] = {}
    for arg in read_args(version, args):
        if arg.option is not None and arg.error is None:
            values.update(dict.fromkeys(arg.option.names, arg.value))
    return values


def spelled_flags(version: str, args: list[str]) -> list[str]:
    """The options of `args` as the help spells them (`--max-running=8` -> `--max-running-requests`),
    for comparing with another copy of the help, such as a host's; an unknown one as written."""
    out = set()
    for arg in read_args(version, args):
        if arg.option is not None:
            out.add(next((n for n in arg.option.names if n.startswith(arg.name)), arg.option.names[0]))
        elif arg.unknown:
            out.add(arg.name)
    return sorted(out)


def _fragment_parser(version: str) -> argparse.ArgumentParser:
    return _fragment_parser_of(help_version(version))


@cache
def _fragment_parser_of(shipped: str) -> argparse.ArgumentParser:
    return build_parser(_table(shipped), fragments=True)


def _pieces(args: list[str], names: set[str] | frozenset[str]) -> list[tuple[int, list[str]]]:
    """`args` cut before each word argparse would take for an option; `--` keeps the rest."""
    pieces: list[tuple[int, list[str]]] = []
    for i, word in enumerate(args):
        if pieces and (pieces[-1][1][0] == "--" or not _looks_like_option(word, names)):
            pieces[-1][1].append(word)
        else:
            pieces.append((i, [word]))
    return pieces


def _looks_like_option(word: str, names: set[str] | frozenset[str]) -> bool:
    """argparse's _parse_optional, reduced to: is this word an option (known or not)?"""
    if len(word) < 2 or not word.startswith("-") or _NEGATIVE.match(word):
        return False
    if " " not in word:
        return True
    head = word.split("=", 1)[0]  # "--max-running-requests 8" is one word: a positional
    return any(n.startswith(head) or n == word[:2] for n in names)


def _read_piece(parser: argparse.ArgumentParser, table: FlagTable, start: int, words: list[str]) -> ExtraArg:
    try:
        namespace, extras = parser.parse_known_args(words)
    except ArgError as exc:
        message = str(exc)
        named = re.match(r"argument (\S+?)[:/]", message)
        option = table.option(named.group(1)) if named else None
        return ExtraArg(start, tuple(words), option, error=message)
    given = vars(namespace)
    option = _option_of(table, next(iter(given), None))
    # After `--` every word is a positional, which SGLang does not take (Python 3.11's
    # argparse leaves the `--` itself over too: "unrecognized arguments: --").
    unknown = (
        bool(extras) and option is None and words[0] != "--" and _looks_like_option(words[0], table.names)
    )
    stray = () if unknown else _positions(words, extras, start)
    value = given[next(iter(given))] if given else None
    return ExtraArg(start, tuple(words), option, value, unknown=unknown, stray=stray)


def _option_of(table: FlagTable, dest: str | None) -> OptionSpec | None:
    if dest is None:
        return None
    if dest == "help":
        return table.option("--help")
    return next((o for o in table.all_options if o.dest == dest), None)


def _positions(words: list[str], extras: list[str], start: int) -> tuple[int, ...]:
    """Where the words argparse left over stand: they trail the words it took, so match from the end."""
    out: list[int] = []
    i = len(words) - 1
    for extra in reversed(extras):
        while i >= 0 and words[i] != extra:
            i -= 1
        if i < 0:
            break
        out.append(start + i)
        i -= 1
    return tuple(reversed(out))


# --- The flags the renderer emits, per version -------------------------------------
# Each modelled setting maps to the spelling that the help of that version on lists (a key
# holds until the next one: 0.5.15 spells as 0.5.9); None means no such flag from that
# version on, and a profile asking for that setting is an error there. Every spelling is
# checked against every shipped help (tests/unit/test_render.py).
MODELLED: dict[str, dict[str, str | None]] = {
    "model_path": {"0.5.9": "--model-path", "0.5.23": "--model-path"},
    "served_model_name": {"0.5.9": "--served-model-name", "0.5.23": "--served-model-name"},
    "tp_size": {"0.5.9": "--tensor-parallel-size", "0.5.23": "--tp-size"},
    "dp_size": {"0.5.9": "--data-parallel-size", "0.5.23": "--dp-size"},
    "host": {"0.5.9": "--host", "0.5.23": "--host"},
    "port": {"0.5.9": "--port", "0.5.23": "--port"},
    "mem_fraction_static": {"0.5.9": "--mem-fraction-static", "0.5.23": "--mem-fraction-static"},
    "context_length": {"0.5.9": "--context-length", "0.5.23": "--context-length"},
    "trust_remote_code": {"0.5.9": "--trust-remote-code", "0.5.23": "--trust-remote-code"},
    "disable_cuda_graph": {"0.5.9": "--disable-cuda-graph", "0.5.23": "--disable-cuda-graph"},
    # 0.5.14 to 0.5.19 keep --cuda-graph-max-bs as a deprecated alias; 0.5.20 drops it.
    "cuda_graph_max_bs": {"0.5.9": "--cuda-graph-max-bs", "0.5.20": "--cuda-graph-max-bs-decode"},
    "log_level": {"0.5.9": "--log-level", "0.5.23": "--log-level"},
    "enable_metrics": {"0.5.9": "--enable-metrics", "0.5.23": "--enable-metrics"},
    "speculative_algorithm": {"0.5.9": "--speculative-algorithm", "0.5.23": "--speculative-algorithm"},
    "speculative_draft_model_path": {
        "0.5.9": "--speculative-draft-model-path",
        "0.5.23": "--speculative-draft-model-path",
    },
    "speculative_num_steps": {"0.5.9": "--speculative-num-steps", "0.5.23": "--speculative-num-steps"},
    "speculative_eagle_topk": {"0.5.9": "--speculative-eagle-topk", "0.5.23": "--speculative-eagle-topk"},
    "speculative_num_draft_tokens": {
        "0.5.9": "--speculative-num-draft-tokens",
        "0.5.23": "--speculative-num-draft-tokens",
    },
    # The helps of 0.5.15 and 0.5.20 list these too, but orchestrator writes the config file in
    # 0.5.23's format (per-batch-size tiers) and follows 0.5.23's rules (sglang_rules.ADAPTIVE_FROM).
    "speculative_adaptive": {"0.5.9": None, "0.5.23": "--speculative-adaptive"},
    "speculative_adaptive_config": {"0.5.9": None, "0.5.23": "--speculative-adaptive-config"},
    "config": {"0.5.9": "--config", "0.5.23": "--config"},
    "disaggregation_mode": {"0.5.9": "--disaggregation-mode"},
    "disaggregation_transfer_backend": {"0.5.9": "--disaggregation-transfer-backend"},
    "disaggregation_bootstrap_port": {"0.5.9": "--disaggregation-bootstrap-port"},
    "disaggregation_ib_device": {"0.5.9": "--disaggregation-ib-device"},
    "nnodes": {"0.5.9": "--nnodes", "0.5.23": "--nnodes"},
    "node_rank": {"0.5.9": "--node-rank", "0.5.23": "--node-rank"},
    "dist_init_addr": {"0.5.9": "--dist-init-addr", "0.5.23": "--dist-init-addr"},
}


def flag(setting: str, version: str) -> str | None:
    """The spelling of a modelled setting for `version` (as its nearest shipped help at or below
    it has it), or None if that help lacks it."""
    return at_or_below(MODELLED[setting], help_version(version))


def modelled_flag_names(version: str) -> set[str]:
    """Every spelling (aliases included) of every flag the renderer may emit for `version`."""
    table = flag_table(version)
    names: set[str] = set()
    for setting in MODELLED:
        spelled = flag(setting, version)
        if spelled:
            opt = table.option(spelled)
            names.update(opt.names if opt else (spelled,))
    return names
