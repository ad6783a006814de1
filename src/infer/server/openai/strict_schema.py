"""OpenAI's strict mode for JSON schemas (``strict: true`` on a ``json_schema`` response
format or a function tool): an object has the properties its schema names and no others.

JSON Schema lets an object without ``additionalProperties`` have any other keys, and a
grammar compiled from it lets the model write them: a small model then adds keys until
``max_tokens`` cuts the answer, which is no longer JSON. Strict mode reads a missing
``additionalProperties`` as ``false``, as OpenAI's does (it requires it) and as vLLM's
default grammar backend does. Where a schema says ``additionalProperties`` (or
``unevaluatedProperties``), that stands; the members of an ``allOf`` are left open, since
each names only part of the object's properties.

Schemas are walked without recursion: a request's may nest deep (``guards/request_limits.py``).
"""

from __future__ import annotations

from typing import Any

# Keywords whose value is a schema, a list of schemas, or a map of names to schemas.
_ONE = (
    "items", "additionalItems", "contains", "not", "if", "then", "else",
    "additionalProperties", "unevaluatedProperties", "unevaluatedItems", "propertyNames",
)  # fmt: skip
_LIST = ("anyOf", "oneOf", "prefixItems", "items")  # ``items`` as a list: draft 4's tuples
_OPEN_KEYS = {"additionalProperties", "unevaluatedProperties"}  # the schema says it itself
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` whose objects without ``additionalProperties`` have it false."""
    copy = _copied(schema)
    stack: list[tuple[Any, bool]] = [(copy, False)]  # (a schema, whether an allOf member)
    while stack:
        node, in_all_of = stack.pop()
        if not isinstance(node, dict):
            continue
        if _is_object(node) and not in_all_of and not _OPEN_KEYS & node.keys():
            node["additionalProperties"] = False
        for key in _ONE:
            if isinstance(node.get(key), dict):
                stack.append((node[key], False))
        for key in _LIST:
            if isinstance(node.get(key), list):
                stack.extend((member, False) for member in node[key])
        for key in _MAP:
            if isinstance(node.get(key), dict):
                stack.extend((member, False) for member in node[key].values())
        if isinstance(node.get("allOf"), list):
            stack.extend((member, True) for member in node["allOf"])
    return copy


def _is_object(node: dict[str, Any]) -> bool:
    kind = node.get("type")
    if kind is None:
        return "properties" in node or "required" in node
    return kind == "object" or (isinstance(kind, list) and "object" in kind)


def _copied(value: Any) -> Any:
    """A deep copy of a JSON value (dicts keep their key order), made without recursion."""
    holder: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(value, holder, 0)]
    while stack:
        source, parent, key = stack.pop()
        if isinstance(source, dict):
            copy: Any = dict.fromkeys(source)
            stack.extend((child, copy, name) for name, child in source.items())
        elif isinstance(source, list):
            copy = [None] * len(source)
            stack.extend((child, copy, i) for i, child in enumerate(source))
        else:
            copy = source
        parent[key] = copy
    return holder[0]
