"""SGLang's flags per version, read from the real `launch_server --help` text.

The help files in `sglang_help/` are the ground truth for which flags a version
accepts. This module is standard-library only on purpose: the lab copies it to
its hosts, where the SGLang stand-in builds its argparse parser from the same
text, so the stand-in accepts exactly what the real server accepts.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

HELP_DIR = Path(__file__).resolve().parent / "sglang_help"

#: SGLang versions whose real --help we ship; a profile must name one of them.
SUPPORTED_VERSIONS = ("0.5.9", "0.5.23")

#: Options argparse marks as required in the usage line of every shipped version.
_REQUIRED = {"--model-path"}

_ENTRY = re.compile(r"^  (-\S.*?)(?:\s{2,}\S.*)?$")


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
    """All options of one SGLang version."""

    version: str
    options: list[OptionSpec] = field(default_factory=list)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(n for o in self.options for n in o.names)

    def option(self, name: str) -> OptionSpec | None:
        for opt in self.options:
            if name in opt.names:
                return opt
        return None


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
        if rest.startswith("{") and rest.endswith("}"):
            choices = tuple(rest[1:-1].split(","))
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
    return HELP_DIR / f"launch_server-help-{version}.txt"


@cache
def flag_table(version: str) -> FlagTable:
    """The options of SGLang `version`, from its shipped help file."""
    path = help_path(version)
    if not path.exists():
        known = ", ".join(SUPPORTED_VERSIONS)
        raise KeyError(f"no --help text for SGLang {version} (known: {known})")
    return FlagTable(version, parse_help(path.read_text()))


def build_parser(table: FlagTable, prog: str = "python -m sglang.launch_server") -> argparse.ArgumentParser:
    """An argparse parser accepting exactly the options of `table`, as SGLang's own does."""
    parser = argparse.ArgumentParser(prog=prog, add_help=False)
    for opt in table.options:
        if opt.names == ("-h", "--help"):
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
            if opt.nargs != "1":
                kwargs["nargs"] = opt.nargs
            if opt.choices:
                kwargs["choices"] = list(opt.choices)
            elif opt.metavar and not opt.metavar.startswith("["):
                kwargs["metavar"] = opt.metavar.split(" ")[0]
        if _REQUIRED.intersection(opt.names):
            kwargs["required"] = True
        parser.add_argument(*opt.names, **kwargs)
    return parser


# --- The flags the renderer emits, per version -------------------------------------
# Each modelled setting maps to the spelling that version's help lists; None means the
# version has no such flag, and a profile asking for that setting is an error there.
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
    "cuda_graph_max_bs": {"0.5.9": "--cuda-graph-max-bs", "0.5.23": "--cuda-graph-max-bs-decode"},
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
    "config": {"0.5.9": "--config", "0.5.23": "--config"},
    "nnodes": {"0.5.9": "--nnodes", "0.5.23": "--nnodes"},
    "node_rank": {"0.5.9": "--node-rank", "0.5.23": "--node-rank"},
    "dist_init_addr": {"0.5.9": "--dist-init-addr", "0.5.23": "--dist-init-addr"},
}


def flag(setting: str, version: str) -> str | None:
    """The spelling of a modelled setting in `version`, or None if that version lacks it."""
    return MODELLED[setting].get(version)


def modelled_flag_names(version: str) -> set[str]:
    """Every spelling (aliases included) of every flag the renderer may emit for `version`."""
    table = flag_table(version)
    names: set[str] = set()
    for per_version in MODELLED.values():
        spelled = per_version.get(version)
        if spelled:
            opt = table.option(spelled)
            names.update(opt.names if opt else (spelled,))
    return names
