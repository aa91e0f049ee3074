"""The JSON Schemas `orchestrator schema` prints say what the loader and the models say.

An editor checks a profile or a space file against them. Where the schema is looser, the editor
misses a mistake. Where it is stricter, the editor flags a valid file. So:
- A bound written under a name only pydantic knows (`ge`, `le`, ...) is ignored there: the editor
  would accept `speculative.num_steps: 0`. Each such case is refused twice: by the model, through the
  real loader, and by the `jsonschema` package, against the schema the CLI prints.
- What the loader reads in, the schema takes: a file without `name:`, a variant that leaves its
  parent's keys out, a number as text (`NCCL_MIN_NCHANNELS: 16`), `gpus: '4-7'`. Every shipped
  profile and every example space is valid to it.

The schema cannot resolve `extends:`, so jsonschema reads the file as written; its verdict is the one
at the field's path.
"""

from __future__ import annotations

import functools
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator, validators
from pydantic import BaseModel, TypeAdapter, ValidationError

from orchestrator.cli.main import cli
from orchestrator.errors import InputError, ProfileError
from orchestrator.profile import model as profile_mod
from orchestrator.profile import yaml12
from orchestrator.tuning import space as space_mod

#: Keywords that only pydantic reads: a JSON Schema validator skips them.
PYDANTIC_ONLY = {
    "ge",
    "le",
    "gt",
    "lt",
    "multiple_of",
    "min_length",
    "max_length",
    "max_digits",
    "decimal_places",
    "strict",
    "allow_inf_nan",
}
#: Keywords of Draft 2020-12 that assert nothing (annotations and the core's own).
ANNOTATIONS = {
    "$schema",
    "$id",
    "$defs",
    "$comment",
    "$anchor",
    "$dynamicAnchor",
    "$vocabulary",
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "contentMediaType",
    "contentEncoding",
    "contentSchema",
}
#: Keywords of Draft 2020-12 that `if` reads: the validator has none of their own.
IF_BRANCHES = {"then", "else"}
#: Where a schema holds values, not schemas: a property may be called `ge`.
DATA = {"default", "examples", "enum", "const"}
NAMED = {"properties", "patternProperties", "$defs", "dependentSchemas"}
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")

#: A space a trial could run: one level of traffic, so each field's own rule is the only one at play.
SPACE: dict[str, Any] = {
    "extends": "example:cg_5tok",
    "baseline": "example:baseline",
    "vary": {"speculative.num_steps": [1, 2]},
    "traffic": {"concurrency": [1], "requests": 4, "max_tokens": 16, "repeat": 2},
    "objective": {"maximize": "tok_s"},
    "budget": {"restarts": 10},
    "search": {"seed": 1},
}


@functools.cache
def printed(kind: str) -> dict[str, Any]:
    """The schema as a user gets it: `orchestrator schema KIND`'s output."""
    result = CliRunner().invoke(cli, ["schema", kind])
    assert result.exit_code == 0, result.output
    schema: dict[str, Any] = json.loads(result.output)
    return schema


def keywords(node: Any, where: str = "#") -> list[tuple[str, str]]:
    """(place, keyword) for every keyword of every schema in `node`."""
    if not isinstance(node, dict):
        return []
    found = [(where, key) for key in node]
    for key, value in node.items():
        if key in DATA:
            continue
        if key in NAMED:
            for name, sub in value.items():
                found += keywords(sub, f"{where}/{key}/{name}")
        elif isinstance(value, list):
            for i, sub in enumerate(value):
                found += keywords(sub, f"{where}/{key}/{i}")
        else:
            found += keywords(value, f"{where}/{key}")
    return found


# --- the schema's words ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["profile", "space"])
def test_the_schema_has_no_keyword_only_pydantic_reads(kind: str) -> None:
    found = keywords(printed(kind))
    assert [f"{where}/{key}" for where, key in found if key in PYDANTIC_ONLY] == []
    known = set(Draft202012Validator.VALIDATORS) | ANNOTATIONS | IF_BRANCHES
    assert [f"{where}/{key}" for where, key in found if key not in known] == []


@pytest.mark.parametrize("kind", ["profile", "space"])
def test_the_schema_is_a_draft_2020_12_schema(kind: str) -> None:
    schema = printed(kind)
    assert validators.validator_for(schema, default=None) is Draft202012Validator
    Draft202012Validator.check_schema(schema)


# --- what the models refuse, the schema refuses -----------------------------------------------------

PROFILE_CASES = [
    ({"server": {"mem_fraction_static": 7}}, ["server.mem_fraction_static"]),
    ({"server": {"mem_fraction_static": 0}}, ["server.mem_fraction_static"]),
    ({"server": {"mem_fraction_static": 1}}, ["server.mem_fraction_static"]),
    ({"server": {"context_length": 0}}, ["server.context_length"]),
    ({"server": {"cuda_graph_max_bs": 2**31}}, ["server.cuda_graph_max_bs"]),
    ({"server": {"gpus": [64, -1]}}, ["server.gpus.0", "server.gpus.1"]),
    ({"server": {"port": 0}}, ["server.port"]),
    ({"server": {"port": 65536}}, ["server.port"]),
    ({"deployment": {"dist_init_port": 0}}, ["deployment.dist_init_port"]),
    ({"deployment": {"dist_init_port": 65536}}, ["deployment.dist_init_port"]),
    ({"speculative": {"num_steps": 0}}, ["speculative.num_steps"]),
    ({"speculative": {"num_steps": 33}}, ["speculative.num_steps"]),
    ({"speculative": {"eagle_topk": 65}}, ["speculative.eagle_topk"]),
    ({"speculative": {"num_draft_tokens": 0}}, ["speculative.num_draft_tokens"]),
    ({"speculative": {"adaptive": {"ema_alpha": 0}}}, ["speculative.adaptive.ema_alpha"]),
    ({"speculative": {"adaptive": {"ema_alpha": 1.5}}}, ["speculative.adaptive.ema_alpha"]),
    ({"speculative": {"adaptive": {"update_interval": 0}}}, ["speculative.adaptive.update_interval"]),
    ({"speculative": {"adaptive": {"warmup_batches": -1}}}, ["speculative.adaptive.warmup_batches"]),
    ({"speculative": {"adaptive": {"down_hysteresis": -33}}}, ["speculative.adaptive.down_hysteresis"]),
    ({"speculative": {"adaptive": {"up_hysteresis": 32.5}}}, ["speculative.adaptive.up_hysteresis"]),
    ({"speculative": {"adaptive": {"ceiling_coeff": 1001}}}, ["speculative.adaptive.ceiling_coeff"]),
    ({"service": {"health_poll_interval_s": 0.001}}, ["service.health_poll_interval_s"]),
    # What the schema now reads in keeps its bounds: no index past 63, no boolean as text.
    ({"server": {"gpus": "0-64"}}, ["server.gpus"]),
    ({"server": {"gpus": "4-5-7"}}, ["server.gpus"]),
    ({"server": {"gpus": "4,,5"}}, ["server.gpus"]),
    ({"server": {"gpus": "1 2"}}, ["server.gpus"]),  # a space inside a number: not GPU 12
    ({"service": {"restart": True}}, ["service.restart"]),
    ({"env": {"A": True}}, ["env.A"]),
    ({"description": False}, ["description"]),
]
SPACE_CASES = [
    ({"traffic": {"concurrency": [0, 5000]}}, ["traffic.concurrency.0", "traffic.concurrency.1"]),
    ({"traffic": {"concurrency": [1025]}}, ["traffic.concurrency.0"]),
    ({"traffic": {"request_rate": [0, 100001]}}, ["traffic.request_rate.0", "traffic.request_rate.1"]),
    ({"traffic": {"requests": 0}}, ["traffic.requests"]),
    ({"objective": {"p99_ttft_ms_max": 0}}, ["objective.p99_ttft_ms_max"]),
    ({"objective": {"tok_s_min": -1}}, ["objective.tok_s_min"]),
    ({"objective": {"total_tok_s_min": 0}}, ["objective.total_tok_s_min"]),
    (
        {"objective": {"goodput": {"p99_ttft_ms": 0, "p99_itl_ms": -1}}},
        ["objective.goodput.p99_ttft_ms", "objective.goodput.p99_itl_ms"],
    ),
    ({"budget": {"restarts": 0}}, ["budget.restarts"]),
    ({"search": {"seed": -1}}, ["search.seed"]),
    ({"search": {"seed": 2**32}}, ["search.seed"]),
]


@functools.cache
def _checker(kind: str) -> Draft202012Validator:
    return Draft202012Validator(printed(kind))


def _schema_refusals(kind: str, document: dict[str, Any]) -> dict[str, str]:
    """jsonschema's complaints about `document`, by dotted path (`traffic.concurrency.0`).

    A field that may be null is an anyOf: its branches' complaints are the ones at the field."""
    errors = list(_checker(kind).iter_errors(document))
    found = {}
    while errors:
        error = errors.pop()
        found[".".join(map(str, error.absolute_path))] = error.message
        errors += error.context or []
    return found


def _id(fragment: dict[str, Any], prefix: str = "") -> str:
    """`speculative.num_steps=0`: the fragment's values at their dotted paths."""
    return ",".join(
        _id(value, f"{prefix}{key}.") if isinstance(value, dict) else f"{prefix}{key}={value}"
        for key, value in fragment.items()
    )


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and key in out else value
    return out


@pytest.mark.parametrize(("fragment", "fields"), PROFILE_CASES, ids=[_id(f) for f, _ in PROFILE_CASES])
def test_a_profile_value_the_model_refuses_the_schema_refuses(
    fragment: dict[str, Any], fields: list[str], tmp_path: Path
) -> None:
    path = tmp_path / "variant.yml"
    document = {"extends": "example:cg_5tok", **fragment}
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(ProfileError) as info:
        profile_mod.load(str(path))
    assert {p.loc for p in info.value.problems} >= set(fields), info.value.problems
    refused = _schema_refusals("profile", document)
    assert [f for f in fields if f not in refused] == [], refused


@pytest.mark.parametrize(("fragment", "fields"), SPACE_CASES, ids=[_id(f) for f, _ in SPACE_CASES])
def test_a_space_value_the_model_refuses_the_schema_refuses(
    fragment: dict[str, Any], fields: list[str], tmp_path: Path
) -> None:
    path = tmp_path / "space.yml"
    document = _merge(SPACE, fragment)
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(ProfileError) as info:
        space_mod.load(path)
    assert {p.loc for p in info.value.problems} >= set(fields), info.value.problems
    refused = _schema_refusals("space", document)
    assert [f for f in fields if f not in refused] == [], refused


def test_the_base_documents_are_valid() -> None:
    """The property below changes one field of these: anything else wrong would blur its verdict."""
    profile_mod.Profile.model_validate(PROFILE)
    space_mod.Space.model_validate(SPACE)
    assert _schema_refusals("profile", PROFILE) == {}
    assert _schema_refusals("space", SPACE) == {}


# --- the property: the same verdict near every bound ------------------------------------------------


def _resolve(root: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    return _resolve(root, root["$defs"][ref.rsplit("/", 1)[-1]]) if ref else node


def bounded_fields(root: dict[str, Any]) -> list[tuple[tuple[str, ...], bool, dict[str, Any]]]:
    """(path, whether the value sits in a list, the number's schema) of every field with a bound.

    A bound under pydantic's own name counts too, so that a schema that hides one is still tested."""
    found = []

    def visit(node: dict[str, Any], path: tuple[str, ...], in_list: bool) -> None:
        node = _resolve(root, node)
        for branch in node.get("anyOf", []):
            visit(branch, path, in_list)
        for name, sub in node.get("properties", {}).items():
            visit(sub, (*path, name), False)
        if node.get("type") == "array" and "items" in node:
            visit(node["items"], path, True)
        if node.get("type") in ("integer", "number") and _bounds(node):
            found.append((path, in_list, node))

    visit(root, (), False)
    return found


def _bounds(node: dict[str, Any]) -> list[float]:
    return [node[k] for k in (*BOUNDS, "ge", "le", "gt", "lt") if k in node]


#: A profile as its file and parents give it: every section there to put a value in.
PROFILE = profile_mod.load_raw("example:cg_5tok")[0]
PROFILE_FIELDS = bounded_fields(printed("profile"))
SPACE_FIELDS = bounded_fields(printed("space"))


def test_the_property_covers_the_fields_that_were_missed() -> None:
    paths = {".".join(path) for path, _, _ in PROFILE_FIELDS + SPACE_FIELDS}
    for field in ("speculative.num_steps", "speculative.adaptive.ema_alpha", "server.gpus", "server.port"):
        assert field in paths
    for field in ("traffic.concurrency", "traffic.request_rate", "objective.goodput.p99_ttft_ms"):
        assert field in paths


@st.composite
def near_a_bound(draw: st.DrawFn, node: dict[str, Any]) -> int | float:
    """A value of the field's type at, next to or far beyond one of its bounds.

    Floats step by a thousandth: service.restart_sec takes whole microseconds only, a rule of its own
    that JSON Schema has no word for."""
    bound = draw(st.sampled_from(_bounds(node)))
    if node["type"] == "integer":
        return int(bound) + draw(st.integers(-3, 3) | st.integers(-(10**12), 10**12))
    # round(): the float a file's `2205.052` reads as, not the sum's 2205.0519999999997.
    return round(bound + draw(st.integers(-2000, 2000) | st.integers(-(10**9), 10**9)) / 1000, 3)


def _set(document: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    head, *rest = path
    inner = document.get(head) if isinstance(document.get(head), dict) else {}
    return {**document, head: _set(inner, tuple(rest), value) if rest else value}


def _model_refusals(model: type[BaseModel], document: dict[str, Any]) -> set[str]:
    try:
        model.model_validate(document)
    except ValidationError as exc:
        return {".".join(map(str, e["loc"])) for e in exc.errors()}
    return set()


def _at(at: str, refusals: Any) -> bool:
    """Whether a refusal is at `at` or inside it: one GPU index (`gpus: 64`) is refused as the list's item."""
    return any(loc == at or loc.startswith(f"{at}.") for loc in refusals)


def _same_verdict(kind: str, model: type[BaseModel], base: dict[str, Any], field: Any, value: Any) -> None:
    path, in_list, _ = field
    document = _set(base, path, [value] if in_list else value)
    at = ".".join(path) + (".0" if in_list else "")
    by_model = _at(at, _model_refusals(model, document))
    by_schema = _at(at, _schema_refusals(kind, document))
    assert by_model == by_schema, f"{at}: {value!r}: model refuses: {by_model}, schema refuses: {by_schema}"


@settings(max_examples=600, deadline=None)
@given(data=st.data())
def test_the_schema_and_the_profile_model_agree_near_every_bound(data: st.DataObject) -> None:
    field = data.draw(st.sampled_from(PROFILE_FIELDS))
    value = data.draw(near_a_bound(field[2]))
    _same_verdict("profile", profile_mod.Profile, PROFILE, field, value)


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_the_schema_and_the_space_model_agree_near_every_bound(data: st.DataObject) -> None:
    field = data.draw(st.sampled_from(SPACE_FIELDS))
    value = data.draw(near_a_bound(field[2]))
    _same_verdict("space", space_mod.Space, SPACE, field, value)


# --- what the loader reads in, the schema takes -----------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


def _read(text: str | bytes) -> Any:
    """The document as the loader reads it (YAML 1.2: `1.10` is a number, `no` is text)."""
    loader = yaml12.Loader(text.encode() if isinstance(text, str) else text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _shipped_profiles() -> dict[str, Path]:
    """The repository's profiles/*.yml and the examples the package ships, once each."""
    found = {f"example:{name}": path for name, path in profile_mod.examples().items()}
    for path in sorted((REPO / "profiles").glob("*.yml")):
        if path.resolve() not in {p.resolve() for p in found.values()}:
            found[f"profiles/{path.name}"] = path
    return found


SHIPPED = _shipped_profiles()


def test_the_shipped_profiles_are_found() -> None:
    assert {"example:base", "example:cg_5tok", "example:cg_16tok"} <= set(SHIPPED)


@pytest.mark.parametrize("ref", list(SHIPPED))
def test_every_shipped_profile_is_valid_to_the_schema(ref: str) -> None:
    profile_mod.load(str(SHIPPED[ref]))
    assert _schema_refusals("profile", _read(SHIPPED[ref].read_bytes())) == {}


def _example_spaces() -> dict[str, tuple[str, str]]:
    """The space files the README, docs/tuning.md and space.py show: their text, and the whole space
    it stands in.

    A block of docs/tuning.md without `vary:` is a part of one (`objective: ...`). It stands in the
    page's first whole space, as a user would put it."""
    found = {}
    readme = (REPO / "README.md").read_text()
    for i, text in enumerate(re.findall(r"cat > \S+\.yml <<'EOF'\n(.*?\n)EOF\n", readme, re.S)):
        found[f"README.md#{i}"] = (text, text)
    blocks = re.findall(r"```yaml\n(.*?\n)```", (REPO / "docs/tuning.md").read_text(), re.S)
    whole = next(b for b in blocks if "\nvary:" in f"\n{b}")
    for i, text in enumerate(blocks):
        keys = set(_read(text))
        if keys <= set(space_mod.Space.model_fields):
            found[f"docs/tuning.md#{i}"] = (text, text if "vary" in keys else _replace_keys(whole, text))
    doc = space_mod.__doc__ or ""
    text = textwrap.dedent(doc.split("A space file:\n\n", 1)[1].split("\n\n", 1)[0]) + "\n"
    found["space.py"] = (text, text)
    return found


def _replace_keys(whole: str, part: str) -> str:
    """`whole` with the top-level keys `part` gives taken from `part` (lines of one key each)."""
    keys = set(_read(part))
    kept = [line for line in whole.splitlines(keepends=True) if line.split(":", 1)[0] not in keys]
    return "".join(kept) + part


SPACES = _example_spaces()


def test_the_example_spaces_are_found() -> None:
    assert {"README.md#0", "space.py"} <= set(SPACES)
    assert len([name for name in SPACES if name.startswith("docs/tuning.md")]) >= 4


@pytest.mark.parametrize("name", list(SPACES))
def test_every_example_space_is_valid_to_the_schema(name: str, tmp_path: Path) -> None:
    """A whole space through the loader; a part's sections each by their own model (a part's
    `at_concurrency: 32` is a level of a traffic the page does not show)."""
    text, whole = SPACES[name]
    if text == whole:
        path = tmp_path / "space.yml"
        path.write_text(text)
        space_mod.load(path)
    else:
        for key, value in _read(text).items():
            TypeAdapter(space_mod.Space.model_fields[key].annotation).validate_python(value)
    assert _schema_refusals("space", _read(whole)) == {}


#: A variant that gives its parent's required keys again, so that only the case's values are new.
VARIANT: dict[str, Any] = {
    "name": "variant",
    "extends": "example:cg_5tok",
    "server": {"model_path": "/data/models/Kimi-K2.5"},
}
READ_IN = [
    {"env": {"OMP_NUM_THREADS": 16}},
    {"env": {"SGLANG_TAG": 1.5}},
    {"nccl": {"NCCL_MIN_NCHANNELS": 16}},
    {"server": {"served_model_name": 7}, "description": 2024},
    {"server": {"extra_args": ["--chunked-prefill-size", 4096]}},
    {"server": {"tp_size": 4, "gpus": "4-7"}},
    {"server": {"tp_size": 4, "gpus": " 0 - 1, 6,7 "}},
    {"server": {"tp_size": 1, "gpus": 5}},
    {"service": {"restart": False}},
    {"service": {"limits": {"nofile": 65536, "memlock": 0}}},
    {"service": {"extra": {"Nice": 5}}},
]


def _loader_accepts(document: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "variant.yml"
    path.write_text(yaml.safe_dump(document))
    profile_mod.load(str(path))


@pytest.mark.parametrize("fragment", READ_IN, ids=[_id(f) for f in READ_IN])
def test_a_value_the_loader_reads_in_the_schema_takes(fragment: dict[str, Any], tmp_path: Path) -> None:
    document = _merge(VARIANT, fragment)
    _loader_accepts(document, tmp_path)
    assert _schema_refusals("profile", document) == {}


LEFT_OUT = {
    "no name": {"server": {"model_path": "/data/m"}},
    "extends, no name, no server": {"extends": "example:cg_5tok"},
    "extends, part of server": {"name": "variant", "extends": "example:cg_5tok", "server": {"port": 30001}},
}


@pytest.mark.parametrize("case", list(LEFT_OUT))
def test_a_key_the_loader_fills_in_the_schema_lets_the_file_leave_out(case: str, tmp_path: Path) -> None:
    _loader_accepts(LEFT_OUT[case], tmp_path)
    assert _schema_refusals("profile", LEFT_OUT[case]) == {}


LOADER_REFUSES = {
    "no extends, no server": ({"name": "x"}, "server"),
    "no extends, no model_path": ({"server": {"port": 30001}}, "server.model_path"),
    "extends: null, no server": ({"extends": None}, "server"),
}


@pytest.mark.parametrize("case", list(LOADER_REFUSES))
def test_a_key_the_loader_needs_the_schema_needs(case: str, tmp_path: Path) -> None:
    """What the parent would give, a file without `extends:` must give itself."""
    document, field = LOADER_REFUSES[case]
    path = tmp_path / "alone.yml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(ProfileError) as info:
        profile_mod.load(str(path))
    assert [p.loc for p in info.value.problems] == [field]
    messages = [error.message for error in _checker("profile").iter_errors(document)]
    assert messages == [f"'{field.rsplit('.', 1)[-1]}' is a required property"]


def test_extends_is_text_to_the_schema_as_to_the_loader(tmp_path: Path) -> None:
    path = tmp_path / "variant.yml"
    path.write_text("extends: 5\n")
    with pytest.raises(InputError, match="extends: must be a profile name"):
        profile_mod.load(str(path))
    assert "extends" in _schema_refusals("profile", {"extends": 5})


def _put(document: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """`document` with `value` at `path`; an int in the path is a list of one item."""
    head, *rest = path
    if isinstance(head, int):
        raise ValueError(f"{path}: a path starts with a key")
    inner: Any = value
    if rest:
        if isinstance(rest[0], int):
            inner = [_put({"item": {}}, ("item", *rest[1:]), value)["item"] if rest[1:] else value]
        else:
            inner = _put(
                document.get(head) if isinstance(document.get(head), dict) else {}, tuple(rest), value
            )
    return {**document, head: inner}


#: Keys of a mapping of free names that a rule would not refuse for its name alone.
FREE_KEYS = {"nccl": "NCCL_MIN_NCHANNELS", "service.extra": "Nice"}


def text_fields(root: dict[str, Any]) -> list[tuple[str | int, ...]]:
    """The path of every field whose schema may take text (a list's item as 0, a free key by name)."""
    found: list[tuple[str | int, ...]] = []

    def visit(node: dict[str, Any], path: tuple[str | int, ...]) -> None:
        node = _resolve(root, node)
        for branch in node.get("anyOf", []):
            visit(branch, path)
        for name, sub in node.get("properties", {}).items():
            visit(sub, (*path, name))
        if isinstance(node.get("items"), dict):
            visit(node["items"], (*path, 0))
        if isinstance(node.get("additionalProperties"), dict):
            key = FREE_KEYS.get(".".join(map(str, path)), "A")
            visit(node["additionalProperties"], (*path, key))
        kinds = node.get("type", [])
        if ("string" in kinds or "enum" in node) and path not in found:
            found.append(path)

    visit(root, ())
    return found


def test_a_number_or_boolean_the_loader_takes_as_text_the_schema_takes(tmp_path: Path) -> None:
    """Every text field, as the schema lists them, given a number or a boolean: where the loader
    reads one in (`env: {A: 16}` is "16", `restart: false` is "no"), the schema must not flag it."""
    fields = text_fields(printed("profile"))
    assert {("env", "A"), ("nccl", "NCCL_MIN_NCHANNELS"), ("service", "restart"), ("name",)} <= set(fields)
    flagged = []
    for path in fields:
        at = ".".join(map(str, path))
        for value in (16, 1.5, True, False):
            document = _put({"name": "variant", "extends": "example:cg_5tok"}, path, value)
            if _loader_refuses_at(at, document, tmp_path):
                continue
            if _at(at, _schema_refusals("profile", document)):
                flagged.append(f"{at}: {value!r}")
    assert flagged == []


def _loader_refuses_at(at: str, document: dict[str, Any], tmp_path: Path) -> bool:
    path = tmp_path / "variant.yml"
    path.write_text(yaml.safe_dump(document))
    try:
        profile_mod.load(str(path))
    except InputError:
        return True
    except ProfileError as exc:
        return _at(at, [p.loc for p in exc.problems])
    return False


#: What the model refuses in `server.gpus` text that a pattern cannot say: order and counting.
UNSAYABLE_GPU_RULES = ("counts down", "GPUs; no host has that many", "is listed twice")


@settings(max_examples=400, deadline=None)
@given(text=st.text(alphabet="0123456789 -,", max_size=14) | st.from_regex(r"\A[0-9]{1,2}(-[0-9]{1,2})?\Z"))
def test_the_schema_and_the_model_read_gpus_text_alike(text: str) -> None:
    """`server.gpus: '4-7'`: the schema takes what the model reads; it refuses the rest but for
    order and counts."""
    document = _set(PROFILE, ("server", "gpus"), text)
    try:
        profile_mod.Profile.model_validate(document)
        by_model = ""
    except ValidationError as exc:
        by_model = "; ".join(
            e["msg"] for e in exc.errors() if _at("server.gpus", [".".join(map(str, e["loc"]))])
        )
    by_schema = _at("server.gpus", _schema_refusals("profile", document))
    if not by_model:
        assert not by_schema, f"{text!r}: the model reads it, the schema refuses it"
    elif not by_schema:
        assert any(rule in by_model for rule in UNSAYABLE_GPU_RULES), (
            f"{text!r}: the schema takes it: {by_model}"
        )
