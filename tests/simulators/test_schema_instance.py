"""The structured-output generator: for each schema a deterministic value that a JSON Schema
validator (formats checked) accepts, and valid JSON, promptly, for schemas nothing satisfies."""

from __future__ import annotations

import json
import time
from typing import Any

import jsonschema_rs
import pytest

from simulators.schema_instance import MAX_ITEMS, instance

TEXT = "Quickly digest summaries group related updates into one friendly note."


def conforms(schema: dict[str, Any], value: Any) -> bool:
    validator = jsonschema_rs.validator_for(schema, validate_formats=True)
    return bool(validator.is_valid(value))


SATISFIABLE: dict[str, dict[str, Any]] = {
    "string": {"type": "string"},
    "string lengths": {"type": "string", "minLength": 5, "maxLength": 5},
    "long string": {"type": "string", "minLength": 300},
    "short string": {"type": "string", "maxLength": 3},
    "enum": {"type": "string", "enum": ["low", "normal", "high"]},
    "const": {"const": {"fixed": [1, 2]}},
    "typed enum": {"type": "integer", "enum": ["one", 2, 3.5]},
    "date-time": {"type": "string", "format": "date-time"},
    "date": {"type": "string", "format": "date"},
    "time": {"type": "string", "format": "time"},
    "duration": {"type": "string", "format": "duration"},
    "email": {"type": "string", "format": "email"},
    "hostname": {"type": "string", "format": "hostname"},
    "ipv4": {"type": "string", "format": "ipv4"},
    "ipv6": {"type": "string", "format": "ipv6"},
    "uuid": {"type": "string", "format": "uuid"},
    "uri": {"type": "string", "format": "uri"},
    "integer range": {"type": "integer", "minimum": 1000, "maximum": 1003},
    "integer exclusive": {"type": "integer", "exclusiveMinimum": 4, "exclusiveMaximum": 6},
    "integer multiple": {"type": "integer", "minimum": 1, "maximum": 100, "multipleOf": 7},
    "integer fractional multiple": {"type": "integer", "multipleOf": 2.5, "minimum": 3},
    "number range": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
    "number multiple": {"type": "number", "minimum": 0.1, "maximum": 0.3, "multipleOf": 0.05},
    "negative only": {"type": "number", "maximum": -1000},
    "huge bound": {"type": "integer", "minimum": 10**40},
    "boolean": {"type": "boolean"},
    "null": {"type": "null"},
    "nullable": {"type": ["string", "null"], "minLength": 2},
    "array": {"type": "array", "items": {"type": "integer"}},
    "array bounds": {"type": "array", "items": {"type": "string"}, "minItems": 3,
                     "maxItems": 4, "uniqueItems": True},
    "empty array only": {"type": "array", "items": {"type": "string"}, "maxItems": 0},
    "tuple": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}],
              "items": False, "minItems": 2},
    "object": {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
        "required": ["b"],
        "additionalProperties": False,
    },
    "min properties": {"type": "object", "minProperties": 3,
                       "additionalProperties": {"type": "boolean"}},
    "any of": {"anyOf": [{"type": "integer", "minimum": 5}, {"type": "string"}]},
    "one of": {"oneOf": [{"type": "object", "properties": {"x": {"type": "string"}},
                          "required": ["x"]}, {"type": "null"}]},
    "all of": {"allOf": [{"type": "object", "properties": {"x": {"type": "string"}},
                          "required": ["x"]},
                         {"properties": {"y": {"type": "integer"}}, "required": ["y"]}]},
    "ref": {"$defs": {"Name": {"type": "string", "minLength": 2}},
            "type": "object", "properties": {"n": {"$ref": "#/$defs/Name"}},
            "required": ["n"], "additionalProperties": False},
    "definitions": {"definitions": {"N": {"type": "integer", "maximum": -5}},
                    "$ref": "#/definitions/N"},
    "escaped pointer": {"$defs": {"a/b": {"type": "boolean"}}, "$ref": "#/$defs/a~1b"},
    "untyped": {"properties": {"k": {"items": {"minimum": 3}}}},
    "true": {"type": "object", "properties": {"any": True}, "required": ["any"]},
}


@pytest.mark.parametrize("schema", SATISFIABLE.values(), ids=SATISFIABLE.keys())
def test_the_value_conforms_and_is_deterministic(schema: dict[str, Any]) -> None:
    value = instance(schema, TEXT)

    assert conforms(schema, value), value
    assert instance(schema, TEXT) == value
    json.dumps(value, allow_nan=False)


def test_an_object_has_every_property_required_first() -> None:
    schema = {
        "type": "object",
        "properties": {"note": {"type": "string"}, "id": {"type": "integer"},
                       "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["id"],
        "additionalProperties": False,
    }

    value = instance(schema, TEXT)

    assert list(value) == ["id", "note", "tags"]
    assert len(value["tags"]) == 1


def test_strings_are_the_completion_text_then_its_words_moved_along() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}}

    value = instance(schema, TEXT)

    assert value["a"] == TEXT
    assert value["b"] != TEXT
    assert sorted(value["b"].lower().rstrip(".").split()) == sorted(
        TEXT.lower().rstrip(".").split())


def test_another_text_gives_another_value() -> None:
    schema = {"type": "object", "properties": {"level": {"enum": list(range(20))},
                                               "at": {"type": "string", "format": "date-time"}}}

    values = {json.dumps(instance(schema, f"Prompt number {n}.")) for n in range(10)}

    assert len(values) > 1


def test_a_recursive_schema_ends_and_conforms() -> None:
    """A tree whose children are trees: recursion stops at the depth limit with an empty list
    of children, which the schema allows."""
    schema = {
        "$defs": {"Tree": {"type": "object", "additionalProperties": False,
                           "required": ["name", "children", "parent"],
                           "properties": {
                               "name": {"type": "string"},
                               "children": {"type": "array", "items": {"$ref": "#/$defs/Tree"}},
                               "parent": {"anyOf": [{"$ref": "#/$defs/Tree"}, {"type": "null"}]},
                           }}},
        "$ref": "#/$defs/Tree",
    }

    value = instance(schema, TEXT)

    assert conforms(schema, value)
    assert value["children"][0]["children"]


UNSATISFIABLE: dict[str, Any] = {
    "false": False,
    "empty range": {"type": "integer", "minimum": 5, "maximum": 1},
    "no integer in range": {"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2},
    "no multiple in range": {"type": "number", "minimum": 1.1, "maximum": 1.2, "multipleOf": 1},
    "dangling ref": {"$ref": "#/$defs/Missing"},
    "remote ref": {"$ref": "https://example.com/schema.json"},
    "ref loop": {"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}},
                 "$ref": "#/$defs/A"},
    "self ref": {"$ref": "#"},
    "required self": {"type": "object", "properties": {"me": {"$ref": "#"}}, "required": ["me"]},
    "fan out": {"type": "object", "required": [f"p{n}" for n in range(50)],
                "properties": {f"p{n}": {"$ref": "#"} for n in range(50)}},
    "all of itself": {"$defs": {"A": {"allOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/A"}]}},
                      "$ref": "#/$defs/A"},
    "huge minItems": {"type": "array", "minItems": 10**12},
    "huge minLength": {"type": "string", "minLength": 10**12},
    "infinite bound": {"type": "number", "minimum": float("inf")},
    "inverted lengths": {"type": "string", "minLength": 10, "maxLength": 2},
    "nonsense keywords": {"type": 5, "properties": [], "required": "x", "items": 3,
                          "minItems": -1, "enum": [], "anyOf": []},
    "not a schema": ["type", "string"],
    # JSON numbers past a double's range parse as infinity, which JSON cannot write back.
    "infinite const": {"const": float("inf")},
    "infinite enum": {"enum": [float("-inf")]},
}


@pytest.mark.parametrize("schema", UNSATISFIABLE.values(), ids=UNSATISFIABLE.keys())
def test_a_schema_nothing_satisfies_still_gets_json_promptly(schema: Any) -> None:
    started = time.monotonic()

    value = instance(schema, TEXT)

    assert time.monotonic() - started < 5
    assert len(json.dumps(value, allow_nan=False)) < 20_000_000
    assert instance(schema, TEXT) == value


def test_minimum_items_are_capped() -> None:
    assert len(instance({"type": "array", "minItems": 10**12}, TEXT)) == MAX_ITEMS
