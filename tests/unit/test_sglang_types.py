"""The types SGLang converts option values with, per shipped version (issue 21).

The help text shows no types, so each shipped help has a table beside it, read from SGLang's
own declarations by scripts/sglang_types.py: these tests hold the tables to the help texts
(a table of another release fails) and the script to the rules of SGLang's code it follows.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.profile import sglang_flags

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = sglang_flags.SHIPPED


#: The `type=` names of the shipped tables whose values are taken as text here, and why: str
#: and none are text in SGLang too; nullable_str maps "" and "None" to None and takes all else;
#: the cuda-graph parsers read a small grammar of their own, left to SGLang.
TEXT_TYPES = {None, "str", "nullable_str", "parse_cuda_graph_config_arg", "parse_cuda_graph_backend_arg"}


@functools.cache
def _script():
    spec = importlib.util.spec_from_file_location("sglang_types_script", ROOT / "scripts/sglang_types.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _help_names(version: str) -> set[str]:
    table = sglang_flags.flag_table(version)
    return {n for o in table.all_options for n in o.names} - {"-h", "--help"}


# --- the shipped tables against the shipped help texts ---------------------------------


def test_every_shipped_help_has_a_table_and_no_table_is_without_one() -> None:
    tables = sorted(p.name for p in sglang_flags.HELP_DIR.glob("launch_server-types-*.json"))
    assert tables == sorted(sglang_flags.types_path(v).name for v in VERSIONS)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_table_names_exactly_the_options_of_its_help(version: str) -> None:
    """Both ways: an option SGLang declares but the help lacks (or the reverse) means the table
    was read from another release than the help."""
    types = sglang_flags.flag_table(version).types
    assert set(types) == _help_names(version)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_typed_option_takes_a_value_and_its_spellings_agree(version: str) -> None:
    table = sglang_flags.flag_table(version)
    for opt in table.all_options:
        if opt.names == ("-h", "--help"):
            continue
        kinds = {table.types[n] for n in opt.names}
        assert len(kinds) == 1, (opt.names, kinds)
        if opt.nargs is None:
            assert kinds == {None}, (opt.names, kinds)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_type_is_checked_here_or_knowingly_taken_as_text(version: str) -> None:
    """A converter a new release brings must be decided on: checked (VALUE_KINDS) or text."""
    for name, kind in sglang_flags.flag_table(version).types.items():
        assert kind in TEXT_TYPES or kind in sglang_flags.VALUE_KINDS, (name, kind)


def test_a_table_of_another_release_fails_the_comparison() -> None:
    old = sglang_flags.read_types(sglang_flags.types_path("0.5.9"))
    assert set(old) != _help_names("0.5.23")
    with pytest.raises(_script().Failed, match=re.escape("do not match the shipped --help of 0.5.23")):
        _script().verify("0.5.23", old)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_numbers_the_rules_read_are_ints(version: str) -> None:
    """What the hand-written INT_FLAGS was for: the rules do arithmetic on these values."""
    types = sglang_flags.flag_table(version).types
    read = ("--page-size", "--pp-size", "--pipeline-parallel-size", "--attn-dp-size")
    read += ("--attention-data-parallel-size", "--speculative-ngram-max-bfs-breadth")
    assert {types[n] for n in read if n in types} == {"int"}
    assert "--page-size" in types and "--pp-size" in types


def test_a_version_without_a_help_of_its_own_takes_the_table_below_it() -> None:
    assert sglang_flags.flag_table("0.5.16").types is sglang_flags.flag_table("0.5.15").types
    assert sglang_flags.flag_table("0.5.16").types["--max-total-tokens"] == "human_readable_int"
    assert sglang_flags.flag_table("0.5.14").types["--max-total-tokens"] == "int"  # 0.5.9's


@pytest.mark.parametrize("version", VERSIONS)
def test_the_shipped_table_is_as_the_script_writes_it(version: str) -> None:
    path = sglang_flags.types_path(version)
    doc = json.loads(path.read_text())
    assert doc["sglang"] == version and doc["made_by"] == "scripts/sglang_types.py"
    assert doc["from"].startswith(f"sglang-{version}-")  # the wheel, with its sha256
    assert list(doc["types"]) == sorted(doc["types"])
    source = _script().Source({}, doc["from"])
    assert _script().render(version, source, doc["types"]) == path.read_text()


# --- how the script reads SGLang's declarations ----------------------------------------


def _read(tmp_path: Path, server_args: str, fields: dict[str, str] | None = None) -> dict[str, str | None]:
    script = _script()
    srt = tmp_path / "sglang/srt"
    (srt / "arg_groups/fields").mkdir(parents=True)
    (srt / "server_args.py").write_text(textwrap.dedent(server_args))
    for name, text in (fields or {}).items():
        (srt / "arg_groups/fields" / name).write_text(textwrap.dedent(text))
    return script.option_types(script.from_tree(tmp_path))


def test_add_argument_calls_give_their_type_or_none(tmp_path: Path) -> None:
    """0.5.9: every option is an add_argument call in ServerArgs.add_cli_args."""
    types = _read(
        tmp_path,
        """
        class ServerArgs:
            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--port", type=int, default=1)
                parser.add_argument("--mem-fraction-static", type=float)
                parser.add_argument("--tp-size", "--tensor-parallel-size", type=int)
                parser.add_argument("--json-model-override-args", type=str)
                parser.add_argument("--preferred-sampling-params", type=json.loads)
                parser.add_argument("--lora-paths", nargs="*", action=LoRAPathAction)
                parser.add_argument("--enable-metrics", action="store_true")
                parser.add_argument("--flag", action=argparse.BooleanOptionalAction)
        """,
    )
    assert types == {
        "--port": "int",
        "--mem-fraction-static": "float",
        "--tp-size": "int",
        "--tensor-parallel-size": "int",
        "--json-model-override-args": "str",
        "--preferred-sampling-params": "json.loads",
        "--lora-paths": None,
        "--enable-metrics": None,
        "--flag": None,
        "--no-flag": None,
    }


def test_annotated_fields_are_typed_as_add_cli_args_from_dataclass_types_them(tmp_path: Path) -> None:
    """0.5.15: arg_groups/arg_utils.py turns `A[T, ...]` fields into arguments."""
    types = _read(
        tmp_path,
        """
        @dataclasses.dataclass
        class ServerArgs:
            port: A[int, "The port."] = 30000
            max_running_requests: A[Optional[int], "Max running."] = None
            ratio: A[float | None, "A ratio."] = None
            level: A[Literal[0, 1, 2], "A level."] = 0
            mode: A[Optional[Literal[None, "a", "b"]], "A mode."] = None
            sizes: A[Optional[List[int]], Arg(help="Sizes.", nargs="*")] = None
            hooks: A[Optional[List[dict]], Arg(help="Hooks.", type_parser=json_list_type)] = None
            tokens: A[Optional[int], Arg(help="x" + f"{doc}", type_parser=human_readable_int)] = None
            override: A[Optional[Union[str, Dict]], "Either."] = None
            enabled: A[Optional[bool], "A switch."] = None
            both: A[bool, Arg(help="On or off.", action=argparse.BooleanOptionalAction)] = True
            old: A[
                Optional[str],
                Arg(help="Old.", action=DeprecatedAliasStoreAction, action_kwargs={"type": int}),
            ] = None
            tp_size: A[int, Arg(help="TP.", aliases=["--tensor-parallel-size"])] = 1
            fp8_gemm_runner_backend: A[str, Arg(help="B.", cli_name="--fp8-gemm-backend")] = "auto"
            internal: A[bool, Arg(no_cli=True)] = False
            plain: int = 0
            dcp_size: A[str, "Declared twice: the last annotation holds."] = "1"
            dcp_size: A[int, "The DCP size."] = 1

            @staticmethod
            def add_cli_args(parser):
                add_cli_args_from_dataclass(parser, ServerArgs)
                parser.add_argument("--config", type=str)
        """,
    )
    assert types == {
        "--port": "int",
        "--max-running-requests": "int",
        "--ratio": "float",
        "--level": "int",
        "--mode": "str",
        "--sizes": "int",
        "--hooks": "json_list_type",
        "--tokens": "human_readable_int",
        "--override": "str",
        "--enabled": None,
        "--both": None,
        "--no-both": None,
        "--old": "int",
        "--tp-size": "int",
        "--tensor-parallel-size": "int",
        "--fp8-gemm-backend": "str",
        "--dcp-size": "int",
        "--config": "str",
    }


def test_namespace_classes_are_read_where_input_namespaces_lists_them(tmp_path: Path) -> None:
    """0.5.20 on: the fields live on the classes of arg_groups/fields/ that server_args.py lists."""
    types = _read(
        tmp_path,
        """
        class ServerArgs:
            @staticmethod
            def add_cli_args(parser):
                add_cli_args_from_dataclass(parser, ServerArgs)
                parser.add_argument("--config", type=str)

        _INPUT_NAMESPACES = [Schedule]
        """,
        {
            "schedule.py": """
            class Base(msgspec.Struct):
                page_size: A[Optional[int], "The page size."] = None

            class Schedule(Base):
                max_running_requests: A[Optional[int], "Max running."] = None

            class Unlisted(msgspec.Struct):
                stray: A[int, "Not an input namespace."] = 0
            """
        },
    )
    assert types == {"--page-size": "int", "--max-running-requests": "int", "--config": "str"}


def test_a_declaration_the_script_cannot_read_is_an_error(tmp_path: Path) -> None:
    script = _script()
    with pytest.raises(script.Failed, match="option names that are not plain strings"):
        _read(
            tmp_path,
            """
            class ServerArgs:
                def add_cli_args(parser):
                    parser.add_argument(NAME, type=int)
            """,
        )


# --- scripts/sglang_help.py holds the tables to the parser SGLang builds ---------------


def test_the_help_script_reports_where_the_real_parser_types_differ() -> None:
    spec = importlib.util.spec_from_file_location("sglang_help_script", ROOT / "scripts/sglang_help.py")
    assert spec and spec.loader
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    # As the driver names them: module and name of a converter, argparse's own --help.
    real = {**sglang_flags.read_types(sglang_flags.types_path("0.5.9")), "-h": None, "--help": None}
    real["--forward-hooks"] = "sglang.srt.utils.common.json_list_type"
    real["--preferred-sampling-params"] = "json.loads"
    assert script.types_report("0.5.9", real) == ""
    real["--max-running-requests"] = "str"
    real["--new-flag"] = "int"
    del real["--port"]
    assert script.types_report("0.5.9", real) == (
        "SGLang 0.5.9's parser and launch_server-types-0.5.9.json differ: types of "
        "--max-running-requests (parser str, table int); options only in the parser: --new-flag; "
        "only in the table: --port"
    )
