#!/usr/bin/env python3
"""Refresh the shipped `--help` texts of SGLang: `python3 scripts/sglang_help.py 0.5.15 [0.5.20 ...]`.

For each version: a fresh venv in a temporary folder, `pip install sglang==VERSION` with all its
dependencies (about 11 GB and 5 minutes; no GPU needed), then SGLang's own
`python -m sglang.launch_server --help`, written to
orchestrator/profile/sglang_help/launch_server-help-<VERSION>.txt. The venv is removed afterwards.

The text is byte for byte what the shipped files were made as (a refresh of 0.5.9 or 0.5.23
changes nothing; `--check` proves it):
- COLUMNS=80, so argparse wraps at 78 as it does on a terminal of 80 columns;
- PYTHONHASHSEED=0: a few choice lists are Python sets (0.5.9's SAMPLING_BACKEND_CHOICES),
  printed in hash order, so another seed reorders `{pytorch,ascend,flashinfer}`;
- the program is named "python -m sglang.launch_server" in every version: argparse would name
  it launch_server.py (0.5.9, from argv[0]) or "sglang serve" (0.5.10 on, prog= of
  prepare_server_args), and the usage lines wrap below the name;
- a Python older than 3.13, whose argparse lists `--tp-size TP_SIZE, --tensor-parallel-size
  TP_SIZE` (3.13 prints `--tp-size, --tensor-parallel-size TP_SIZE`, which
  orchestrator/profile/sglang_flags.py does not read);
- one blank line at the end, as `print(parser.format_help())` leaves it.

It also lists the options SGLang's parser takes but hides from --help (`help=SUPPRESS`), which
argparse still matches prefixes against: they belong in sglang_flags.HIDDEN. And it compares the
`type=` of every option of that parser with the version's shipped types table, which
scripts/sglang_types.py reads from SGLang's source without installing it: a difference is
reported, so the table is proven against the parser SGLang itself builds.

What pip installs is what a host gets today: SGLang pins most of its dependencies, but not all,
and a newer smg-grpc-servicer adds --servicer-impl, --metrics-port and --metrics-host to the
parser (0.5.23's shipped text predates that; the check says DIFFERS there, and in the order of
one choice set, which the shipped file has from an unseeded run). pip's own configuration
applies: where it names a find-links folder with a local torch build (`2.13.0+cpu` matches
`torch==2.13.0`), run with PIP_CONFIG_FILE=/dev/null and without PIP_FIND_LINKS.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.profile import sglang_flags  # noqa: E402 (the checkout's, not an installed copy)

PROG = "python -m sglang.launch_server"

#: Runs inside the venv: SGLang's own launch_server as `python -m` runs it, up to the parser it
#: builds printing its help, which is given the program name of the shipped files and reports
#: the options it hides.
DRIVER = """
import argparse, json, os, runpy, sys
hidden = []
types = {}
def type_name(t):
    if t is None:
        return None
    module, name = getattr(t, "__module__", ""), getattr(t, "__qualname__", repr(t))
    return name if module == "builtins" else f"{module}.{name}"
print_help = argparse.ArgumentParser.print_help
def noting_print_help(self, file=None):
    self.prog = os.environ["SGLANG_HELP_PROG"]
    hidden.extend(a.option_strings for a in self._actions if a.option_strings and a.help == argparse.SUPPRESS)
    types.update((o, type_name(a.type)) for a in self._actions for o in a.option_strings)
    print_help(self, file)
argparse.ArgumentParser.print_help = noting_print_help
sys.argv = [os.environ["SGLANG_HELP_PROG"], "--help"]
try:
    runpy.run_module("sglang.launch_server", run_name="__main__")
    code = 0
except SystemExit as exc:
    code = exc.code
sys.stdout.flush()
with open(os.environ["SGLANG_HELP_HIDDEN"], "w") as fh:
    json.dump({"hidden": hidden, "types": types}, fh)
sys.exit(code)
"""


class Failed(Exception):
    pass


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-15:]
        raise Failed(f"`{' '.join(argv[:4])} ...` exited {result.returncode}:\n  " + "\n  ".join(tail))
    return result


def check_python(python: str) -> None:
    out = _run([python, "-c", "import sys; print(*sys.version_info[:2])"]).stdout.split()
    major, minor = int(out[0]), int(out[1])
    if not (3, 10) <= (major, minor) < (3, 13):
        raise Failed(
            f"{python} is Python {major}.{minor}: use 3.10 to 3.12 (--python), whose argparse prints the "
            "option lists the shipped files have (3.13 joins aliases before one metavar)"
        )


#: Runs inside the venv: the requirements of the installed sglang that apply to this Python and
#: platform (no extras), one a line, less the names given as arguments.
REQUIREMENTS = """
import importlib.metadata as m, sys
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name
left_out = {canonicalize_name(n) for n in sys.argv[1:]}
for text in m.requires("sglang") or []:
    req = Requirement(text)
    applies = req.marker is None or req.marker.evaluate({"extra": ""})
    if applies and canonicalize_name(req.name) not in left_out:
        print(text.split(";")[0].strip())
"""


def produce(version: str, python: str, work: Path, without: list[str]) -> tuple[str, dict]:
    """(the help text, {"hidden": options, "types": option -> type}) of SGLang `version`'s parser,
    from a fresh venv under `work`."""
    venv = work / "venv"
    _run([python, "-m", "venv", str(venv)])
    pip = [str(venv / "bin/python"), "-m", "pip", "--disable-pip-version-check", "install", "-q"]
    if without:
        # sglang alone, then every requirement it names but these (one that PyPI cannot install).
        _run([*pip, "--no-deps", f"sglang=={version}"])
        wanted = _run([str(venv / "bin/python"), "-c", REQUIREMENTS, *without]).stdout.splitlines()
        _run([*pip, *wanted])
    else:
        _run([*pip, f"sglang=={version}"])
    code = "import importlib.metadata as m; print(m.version('sglang'))"
    installed = _run([str(venv / "bin/python"), "-c", code]).stdout.strip()
    if installed != version:
        raise Failed(f"pip installed sglang {installed}, not {version}")
    hidden_file = work / "hidden.json"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))},
        "COLUMNS": "80",
        "PYTHONHASHSEED": "0",
        "SGLANG_HELP_HIDDEN": str(hidden_file),
        "SGLANG_HELP_PROG": PROG,
    }
    # cwd: an empty folder, so nothing named sglang beside it shadows the installed package.
    empty = work / "cwd"
    empty.mkdir()
    result = _run([str(venv / "bin/python"), "-c", DRIVER], env=env, cwd=empty)
    return result.stdout + "\n", json.loads(hidden_file.read_text())


def verify(version: str, text: str) -> None:
    """What orchestrator/profile/sglang_flags.py needs of the text, so a bad one is never written."""
    if not text.startswith(f"usage: {PROG} "):
        raise Failed(f"SGLang {version}'s help does not start with 'usage: {PROG}': {text[:80]!r}")
    specs = sglang_flags.parse_help(text)
    names = {n for s in specs for n in s.names}
    missing = {"--model-path", "--port", "--config"} - names
    if missing:
        raise Failed(f"SGLang {version}'s help lacks {', '.join(sorted(missing))}: not a launch_server help")


def types_report(version: str, types: dict[str, str | None]) -> str:
    """Where the `type=` of SGLang's parser differs from the shipped table (scripts/sglang_types.py),
    as one line; "" where they agree. The parser names a converter by module and name
    (sglang.srt.utils.common.json_list_type), the table as the source spells it (json_list_type),
    so the last parts are compared."""
    path = sglang_flags.types_path(version)
    if not path.is_file():
        return f"no {path.name}: run scripts/sglang_types.py {version}"
    table = sglang_flags.read_types(path)
    real = {n: t for n, t in types.items() if n not in ("-h", "--help")}
    differ = [
        f"{n} (parser {real[n]}, table {table[n]})"
        for n in sorted(real.keys() & table.keys())
        if _last(real[n]) != _last(table[n])
    ]
    only_real, only_table = sorted(real.keys() - table.keys()), sorted(table.keys() - real.keys())
    if not (differ or only_real or only_table):
        return ""
    return (
        f"SGLang {version}'s parser and {path.name} differ: types of {', '.join(differ) or 'none'}; "
        f"options only in the parser: {', '.join(only_real) or 'none'}; only in the table: "
        f"{', '.join(only_table) or 'none'}"
    )


def _last(type_name: str | None) -> str | None:
    return None if type_name is None else type_name.rpartition(".")[2]


def hidden_report(version: str, hidden: list[list[str]]) -> str:
    listed = {n for o in sglang_flags.HIDDEN.get(version, ()) for n in o.names}
    found = {n for names in hidden for n in names}
    if found == listed:
        return ""
    return (
        f"SGLang {version} hides {', '.join(sorted(found)) or 'no options'} from --help; "
        f"sglang_flags.HIDDEN lists {', '.join(sorted(listed)) or 'none'} for it: bring HIDDEN in line"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="+", metavar="VERSION", help="SGLang releases, e.g. 0.5.15")
    parser.add_argument("--python", default=sys.executable, help="Python 3.10-3.12 for the venvs")
    parser.add_argument("--out", type=Path, default=sglang_flags.HELP_DIR, help="where the texts go")
    parser.add_argument("--check", action="store_true", help="compare with the files there; write none")
    parser.add_argument("--keep", action="store_true", help="keep each venv (printed) instead of removing it")
    parser.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="PACKAGE",
        help="install sglang's requirements except this one (0.5.19 to 0.5.22 pin cuda-tile==1.6.0rc5, "
        "whose PyPI sdist only fetches a wheel from NVIDIA's index); a --help that imports it then fails",
    )
    args = parser.parse_args()
    failed = 0
    try:
        check_python(args.python)
    except Failed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for version in args.versions:
        work = Path(tempfile.mkdtemp(prefix=f"sglang-help-{version}-"))
        try:
            text, parsed = produce(version, args.python, work, args.without)
            verify(version, text)
        except Failed as exc:
            print(f"error: SGLang {version}: {exc}", file=sys.stderr)
            failed += 1
            continue
        finally:
            if args.keep:
                print(f"kept {work}", file=sys.stderr)
            else:
                shutil.rmtree(work, ignore_errors=True)
        path = args.out / sglang_flags.help_path(version).name
        note = hidden_report(version, parsed["hidden"])
        if note:
            print(f"note: {note}", file=sys.stderr)
        typed = types_report(version, parsed["types"])
        if typed:
            print(f"note: {typed}", file=sys.stderr)
            failed += args.check
        if args.check:
            same = path.is_file() and path.read_text() == text
            print(f"{path}: {'identical' if same else 'DIFFERS'} ({len(text.encode())} bytes produced)")
            failed += not same
        else:
            path.write_text(text)
            left_out = f", without {', '.join(args.without)}" if args.without else ""
            print(f"wrote {path} ({len(text.encode())} bytes{left_out})")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
