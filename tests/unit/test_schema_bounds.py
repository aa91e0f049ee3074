"""The JSON Schemas `orchestrator schema` prints hold the models' own bounds, in JSON Schema's words.

An editor checks a profile or a space file against them. A bound written under a name only pydantic
knows (`ge`, `le`, ...) is ignored there: the editor would accept `speculative.num_steps: 0`, which
the model refuses. Each case below is refused twice: by the model, through the real loader, and by
the `jsonschema` package, against the schema the CLI prints.

The schema cannot resolve `extends:`, so jsonschema reads the file as written and its verdict is the
one at the field's path; a profile still lacks what its parent gives (`server.model_path`), which
jsonschema reports at other paths.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator, validators
from pydantic import BaseModel, ValidationError

from orchestrator.cli.main import cli
from orchestrator.errors import ProfileError
from orchestrator.profile import model as profile_mod
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
    known = set(Draft202012Validator.VALIDATORS) | ANNOTATIONS
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


def _same_verdict(kind: str, model: type[BaseModel], base: dict[str, Any], field: Any, value: Any) -> None:
    path, in_list, _ = field
    document = _set(base, path, [value] if in_list else value)
    at = ".".join(path) + (".0" if in_list else "")
    by_model = at in _model_refusals(model, document)
    by_schema = at in _schema_refusals(kind, document)
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
