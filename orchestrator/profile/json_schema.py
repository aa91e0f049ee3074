"""The JSON Schema of a profile file or a space file, as editors read it (`orchestrator schema`).

An editor flags what the schema refuses. So the schema says the model's own rules: no looser where
the model bounds a value, no stricter where the model or the loader reads a value in.

Bounds. Pydantic writes some bounds under its own names (`ge`, `le`, `gt`, `lt`, `multiple_of`). It
does so where it cannot put the bound on the type itself: an `Int | None` field, a list's items, a
type that carries a validator. JSON Schema validators ignore names they do not know. An editor would
then accept `speculative.num_steps: 0`, which the model refuses. `EditorSchema` writes each of them
under its JSON Schema keyword.

Values read in. Pydantic's schema says a field's type, not what its validators turn into it:
- A text field of a profile takes a number as its text (`NCCL_MIN_NCHANNELS: 16` is "16"). It never
  takes a boolean. Its schema takes numbers too, unless its pattern matches no number's text.
- `server.gpus` takes one index (`5`) and text (`'4-7'`, `'0-1,6,7'`) besides a list.
- `service.restart` takes `false`, which YAML 1.1 makes of a bare `no`.

A profile file. The loader completes it before the model reads it (model.load_raw):
- `name` is the file's stem where the file has none.
- With `extends:`, the parent gives the rest. Mappings merge key by key, so a key that a section
  requires may be the parent's. A file without `extends:` must give every one.
- `extends` is text. The loader refuses a number before the model would read it as text.
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from orchestrator.profile import model as profile_model

#: Pydantic's name of a bound -> the JSON Schema keyword that says the same.
KEYWORDS = {
    "ge": "minimum",
    "le": "maximum",
    "gt": "exclusiveMinimum",
    "lt": "exclusiveMaximum",
    "multiple_of": "multipleOf",
}
#: Pydantic's length bounds: the keyword depends on what is measured.
LENGTHS = {
    "min_length": {"string": "minLength", "array": "minItems", "object": "minProperties"},
    "max_length": {"string": "maxLength", "array": "maxItems", "object": "maxProperties"},
}
#: Pydantic's keywords that JSON Schema cannot say (Decimal digits, strictness, inf and nan).
UNSAYABLE = ("max_digits", "decimal_places", "strict", "allow_inf_nan")

#: Where a schema holds other schemas (JSON Schema 2020-12, core and applicator vocabularies).
_ONE = (
    "items",
    "additionalItems",
    "additionalProperties",
    "unevaluatedItems",
    "unevaluatedProperties",
    "propertyNames",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "contentSchema",
)
_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_MAPS = ("properties", "patternProperties", "dependentSchemas", "$defs", "definitions")


#: Texts of numbers as a YAML file may write them: a pattern that matches none refuses every number.
NUMBER_TEXTS = ("0", "16", "-1", "+1", "1.5", ".5", "1e5", "010", "0x1f", "0o17", ".inf", ".nan")
#: Most digits of one GPU index in `server.gpus` text, leading zeros included (model._gpu_index).
GPU_DIGITS = 18


class EditorSchema(GenerateJsonSchema):
    """Pydantic's schema generator, with every bound under its JSON Schema keyword, and every value
    the model reads in allowed."""

    def generate(self, schema: CoreSchema, mode: JsonSchemaMode = "validation") -> JsonSchemaValue:
        json_schema = super().generate(schema, mode=mode)
        _translate(json_schema, "#")
        # The dialect first: an editor picks its rules by it (pydantic writes 2020-12's).
        return {"$schema": self.schema_dialect, **self.sort(json_schema)}

    def str_schema(self, schema: core_schema.StringSchema) -> JsonSchemaValue:
        """Text; a number too, where the model takes one as its text (coerce_numbers_to_str)."""
        json_schema = super().str_schema(schema)
        # _config: the config of the model being written (pydantic keeps a stack of them).
        if self._config.coerce_numbers_to_str and _number_may_match(json_schema.get("pattern")):
            # The pattern, if any, holds for text only: a number's text goes unchecked (looser).
            json_schema["type"] = ["string", "number"]
        return json_schema

    def function_before_schema(self, schema: core_schema.BeforeValidatorFunctionSchema) -> JsonSchemaValue:
        """The field's type, or what the validator turns into it."""
        json_schema = super().function_before_schema(schema)
        also = _read_in(schema["function"]["function"], json_schema) if self.mode == "validation" else []
        return {"anyOf": [json_schema, *also]} if also else json_schema


def of(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema `orchestrator schema` prints for `model`'s files."""
    schema = model.model_json_schema(schema_generator=EditorSchema)
    if issubclass(model, profile_model.Profile):
        _as_profile_file(schema)
    return schema


def _number_may_match(pattern: str | None) -> bool:
    return pattern is None or any(re.search(pattern, text) for text in NUMBER_TEXTS)


def _read_in(validator: Any, inner: JsonSchemaValue) -> list[JsonSchemaValue]:
    """What a model's before-validator turns into a value of `inner`: the schemas of those inputs.

    Most only check a value (`_one_reading`); a number that becomes text is str_schema's."""
    if validator is profile_model._gpu_set:
        # One index is a list of it; text is a list of indexes and ranges.
        return [
            copy.deepcopy(inner["items"]),
            {"type": "string", "pattern": _gpu_text(profile_model.MAX_GPU)},
        ]
    if validator is profile_model._restart:
        return [{"const": False}]
    return []


def _gpu_text(highest: int) -> str:
    """The pattern of `server.gpus` as text (model._gpu_set): indexes from 0 to `highest`, and
    ranges of them, comma-separated. Spaces may stand around a number, never inside one:
    '0 - 1, 6' is '0-1,6', and '1 2' is nothing."""
    by_length: dict[int, list[str]] = {}
    for digits in _up_to(highest):
        by_length.setdefault(len(digits), []).append("".join(digits))
    number = "|".join(f"(?:0){{0,{GPU_DIGITS - n}}}(?:{'|'.join(forms)})" for n, forms in by_length.items())
    # A part holds one '-' at most: '4-7' is a range, '4-5-7' is nothing.
    return f"^(?!.*-[^,]*-) *(?:{number})(?: *[-,] *(?:{number}))* *$"


def _up_to(highest: int) -> list[list[str]]:
    """The numbers from 0 to `highest` without leading zeros, as lists of digit classes:
    63 is [0-9], [1-5][0-9] and 6[0-3]."""
    top = str(highest)
    found = [["[0-9]"] if n == 1 else ["[1-9]"] + ["[0-9]"] * (n - 1) for n in range(1, len(top))]
    for i, digit in enumerate(top):
        low = 1 if i == 0 and len(top) > 1 else 0
        last = i == len(top) - 1
        high = int(digit) if last else int(digit) - 1
        if high >= low:
            found.append([*top[:i], f"[{low}-{high}]"] + ["[0-9]"] * (len(top) - i - 1))
    return found


def _as_profile_file(schema: dict[str, Any]) -> None:
    """The schema of a profile as its file may say it, before the loader completes it (in place)."""
    schema["required"].remove("name")  # the loader takes the file's stem
    _text_only(schema["properties"]["extends"])
    done: dict[str, JsonSchemaValue] = {}
    walked: Counter[str] = Counter()
    whole = _required_keys(schema, schema, done, walked)
    used = _refs(schema)
    shared = sorted(ref for ref, needs in done.items() if needs and walked[ref] != used[ref])
    if shared:
        # A list's item is given whole, even with `extends`: its keys stay required there.
        raise TypeError(
            f"{', '.join(shared)}: a section that merges is used elsewhere too; give it a model of its own"
        )
    if whole:
        # Without `extends`, the file gives it all. With it, the parent gives what the file lacks.
        schema["if"] = {"properties": {"extends": {"type": "string"}}, "required": ["extends"]}
        schema["else"] = whole


def _required_keys(
    root: dict[str, Any], node: dict[str, Any], done: dict[str, JsonSchemaValue], walked: Counter[str]
) -> JsonSchemaValue:
    """The keys a file without `extends` must give in the mapping `node`, and in its sections.

    They move out of the mappings themselves: a file with `extends` may give part of one, as its
    parent's merges in. `done` holds what each $ref needs; `walked` counts each $ref followed."""
    found = []
    for ref, mapping in _mappings(root, node):
        if ref is not None:
            walked[ref] += 1
            if ref in done:
                found.append(done[ref])
                continue
        needs: dict[str, Any] = {}
        if ref is not None:
            done[ref] = needs  # filled below; a section inside itself finds it
        required = mapping.pop("required", [])
        if required:
            needs["required"] = required
        inner = {
            key: sub
            for key, value in mapping["properties"].items()
            if (sub := _required_keys(root, value, done, walked))
        }
        if inner:
            needs["properties"] = inner
        found.append(needs)
    found = [needs for needs in found if needs]
    if len(found) > 1:
        raise TypeError(f"{node}: a union of sections that require keys; the schema cannot say which")
    return found[0] if found else {}


def _mappings(root: dict[str, Any], node: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
    """The sections (models: mappings of named keys) `node` may be, each with its $ref if any."""
    found = []
    for branch in [node, *node.get("anyOf", [])]:
        ref = branch.get("$ref")
        if ref is not None:
            found.append((ref, root["$defs"][ref.removeprefix("#/$defs/")]))
        elif branch.get("type") == "object":
            found.append((None, branch))
    return [(ref, mapping) for ref, mapping in found if "properties" in mapping]


def _refs(node: Any) -> Counter[str]:
    """How often each $ref is written in `node`."""
    found: Counter[str] = Counter()
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            found[node["$ref"]] += 1
        for value in node.values():
            found += _refs(value)
    elif isinstance(node, list):
        for item in node:
            found += _refs(item)
    return found


def _text_only(node: dict[str, Any]) -> None:
    """Text, not a number, in `node` and its branches (in place)."""
    for branch in [node, *node.get("anyOf", [])]:
        if branch.get("type") == ["string", "number"]:
            branch["type"] = "string"


def _translate(node: Any, where: str) -> None:
    """Rename pydantic's bounds in `node` and every schema inside it, in place.

    Only schema positions are walked: a property named `ge`, or a default that holds one, stays."""
    if not isinstance(node, dict):
        return
    for name in [k for k in node if k in KEYWORDS or k in LENGTHS]:
        value = node.pop(name)
        _put(node, KEYWORDS.get(name) or _length_keyword(node, name, where), value)
    left = [k for k in UNSAYABLE if k in node]
    if left:
        # A new model field did this: the schema would hide a rule, so say so at once.
        raise TypeError(f"{where}: {', '.join(left)} has no JSON Schema keyword; bound the field otherwise")
    for key in _ONE:
        _translate(node.get(key), f"{where}/{key}")
    for key in _LISTS:
        for i, item in enumerate(node.get(key) or []):
            _translate(item, f"{where}/{key}/{i}")
    for key in _MAPS:
        for name, item in (node.get(key) or {}).items():
            _translate(item, f"{where}/{key}/{name}")


def _length_keyword(node: dict[str, Any], name: str, where: str) -> str:
    """The keyword of a length bound; on text that may be a number, the text's (a number's goes unchecked)."""
    kinds = node.get("type", "")
    found = {LENGTHS[name][k] for k in (kinds if isinstance(kinds, list) else [kinds]) if k in LENGTHS[name]}
    if len(found) != 1:
        raise TypeError(f"{where}: {name} on a schema of type {kinds!r} has no JSON Schema keyword")
    return found.pop()


def _put(node: dict[str, Any], keyword: str, value: Any) -> None:
    """Set `keyword`; where the node has it already with another value, both must hold (allOf)."""
    if keyword not in node or node[keyword] == value:
        node[keyword] = value
    else:
        node.setdefault("allOf", []).append({keyword: value})
