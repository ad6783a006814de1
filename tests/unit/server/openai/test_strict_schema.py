"""Strict mode: objects without ``additionalProperties`` get it false, wherever a schema
sits (properties, items, anyOf, $defs, ...), and only there: data (``const``, ``enum``,
``default``) and what the schema says itself stay as written."""

from __future__ import annotations

import json
from typing import Any

from infer.server.openai.strict_schema import strict_schema


def test_every_object_schema_is_closed() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "person": {"type": "object", "properties": {"name": {"type": "string"}}},
            "tags": {"type": "array", "items": {"properties": {"k": {"type": "string"}}}},
            "either": {"anyOf": [{"type": "object"}, {"type": "string"}]},
            "ref": {"$ref": "#/$defs/point"},
            "open": {"type": "object", "additionalProperties": {"type": "integer"}},
            "const": {"const": {"type": "object"}, "default": {"type": "object"}},
        },
        "$defs": {"point": {"type": ["object", "null"], "required": ["x"]}},
    }
    before = json.dumps(schema)
    strict = strict_schema(schema)
    assert json.dumps(schema) == before  # the request's own schema is left alone
    props = strict["properties"]
    assert strict["additionalProperties"] is False
    assert props["person"]["additionalProperties"] is False
    assert props["tags"]["items"]["additionalProperties"] is False
    assert props["either"]["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in props["either"]["anyOf"][1]
    assert strict["$defs"]["point"]["additionalProperties"] is False
    assert props["open"]["additionalProperties"] == {"type": "integer"}
    assert props["const"] == {"const": {"type": "object"}, "default": {"type": "object"}}
    assert list(strict["properties"]) == list(schema["properties"])  # the order written


def test_the_parts_of_an_all_of_stay_open() -> None:
    """Each part names only some of the properties: closing it would refuse the others'."""
    part = {"type": "object", "properties": {"a": {"type": "object"}}}
    strict = strict_schema({"allOf": [part, {"properties": {"b": {}}}]})
    assert "additionalProperties" not in strict["allOf"][0]
    assert strict["allOf"][0]["properties"]["a"]["additionalProperties"] is False


def test_a_deep_schema_needs_no_recursion() -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(5000):
        deep = {"type": "object", "properties": {"a": deep}}
    strict = strict_schema(deep)
    for _ in range(4999):
        assert strict["additionalProperties"] is False
        strict = strict["properties"]["a"]
