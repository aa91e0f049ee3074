"""The JSON Schema of a profile file or a space file, as editors read it (`orchestrator schema`).

Pydantic writes some bounds under its own names (`ge`, `le`, `gt`, `lt`, `multiple_of`). It does so
where it cannot put the bound on the type itself: an `Int | None` field, a list's items, a type
that carries a validator. JSON Schema validators ignore names they do not know. An editor would
then accept `speculative.num_steps: 0`, which the model refuses. `EditorSchema` writes each of
them under its JSON Schema keyword, so the editor sees the model's own rules.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, JsonSchemaValue
from pydantic_core import CoreSchema

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


class EditorSchema(GenerateJsonSchema):
    """Pydantic's schema generator, with every bound under its JSON Schema keyword."""

    def generate(self, schema: CoreSchema, mode: JsonSchemaMode = "validation") -> JsonSchemaValue:
        json_schema = super().generate(schema, mode=mode)
        _translate(json_schema, "#")
        # The dialect first: an editor picks its rules by it (pydantic writes 2020-12's).
        return {"$schema": self.schema_dialect, **self.sort(json_schema)}


def of(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema `orchestrator schema` prints for `model`'s files."""
    return model.model_json_schema(schema_generator=EditorSchema)


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
    keyword = LENGTHS[name].get(node.get("type", ""))
    if keyword is None:
        raise TypeError(
            f"{where}: {name} on a schema of type {node.get('type')!r} has no JSON Schema keyword"
        )
    return keyword


def _put(node: dict[str, Any], keyword: str, value: Any) -> None:
    """Set `keyword`; where the node has it already with another value, both must hold (allOf)."""
    if keyword not in node or node[keyword] == value:
        node[keyword] = value
    else:
        node.setdefault("allOf", []).append({keyword: value})
