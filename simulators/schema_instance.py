"""A deterministic JSON value that conforms to a JSON Schema: the OpenAI simulator's answer to
`response_format: {"type": "json_schema", ...}` (structured outputs).

`instance(schema, text)` builds the value from `text`, the completion the simulator would
otherwise answer, so the same prompt and schema always give the same value. It covers:

- `type` (one or a list: the first type that is not `"null"`), `const`, `enum` (a member
  picked by `text`), `anyOf` / `oneOf` (the first branch), `allOf` (branches merged);
- `$ref` to any local JSON pointer (`#`, `#/$defs/...`, `#/definitions/...`), its sibling
  keywords applied on top of the target;
- objects: every property of `properties`, the `required` ones first, and nothing else (so
  `additionalProperties: false` holds); `minProperties` / `maxProperties`;
- strings: the words of `text` (each string starts at another word), padded or cut to
  `minLength` / `maxLength`; `format` date-time, date, time, duration, email, hostname, ipv4,
  ipv6, uuid and uri give a fixed value of that form;
- integers and numbers: inside `minimum` / `maximum` and their exclusive forms (draft 4's
  booleans too), on `multipleOf`;
- booleans and null;
- arrays: `items` and `prefixItems`, with `minItems` values, and one value (or one per
  `prefixItems` entry) when the schema does not ask for more, at most `maxItems`.

`pattern`, `contains`, `not`, `if`/`then`/`else` and `patternProperties` are not considered:
a user-supplied regular expression is not run, so no pattern can stall the simulator.

Recursion stops at MAX_DEPTH levels of nesting and references (or after MAX_VALUES values):
past it a nullable value is null, an `anyOf` takes a null branch when it has one, an array
has only its `minItems` values and an object only its required properties. A schema no value
satisfies (an empty numeric range, `false`, a `$ref` that does not resolve, `minItems` or
`minLength` beyond MAX_ITEMS / MAX_STRING_CHARS, a recursion that cannot end, a `const` JSON
cannot write) still gets valid JSON: the nearest value the rules above make, or null.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import re
import uuid
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any
from urllib.parse import unquote

MAX_DEPTH = 10
MAX_VALUES = 5_000
MAX_ITEMS = 100
MAX_STRING_CHARS = 10_000
# Hard stops, past which values are null: a schema whose recursion cannot end (a required
# property that refers to its own object) or that fans out without bound must still get an
# answer, and soon. They also keep the answer's size bounded whatever the schema asks for.
HARD_DEPTH = 40
HARD_VALUES = 20_000
HARD_STEPS = 100_000
MAX_TOTAL_CHARS = 1_000_000
# A chain of references that never reaches a schema (`A -> B -> A`) is cut here.
MAX_REF_HOPS = 32

_EPOCH = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
_WORD = re.compile(r"[A-Za-z]+")


def instance(schema: object, text: str) -> Any:
    """A value that conforms to ``schema``, built from ``text``; see the module docstring."""
    return _Builder(schema, text).build(schema, 0)


class _Builder:
    def __init__(self, root: object, text: str) -> None:
        self.root = root
        self.text = text.strip() or "Value."
        found: list[str] = _WORD.findall(self.text)
        self.words = [word.lower() for word in found] or ["value"]
        digest = hashlib.sha256(self.text.encode()).digest()
        self.seed = int.from_bytes(digest[:8], "big")
        self.uuid = str(uuid.UUID(bytes=digest[:16], version=4))
        self.values = 0
        self.steps = 0
        self.strings = 0
        self.numbers = 0
        self.chars = 0

    @property
    def exhausted(self) -> bool:
        return (self.values > HARD_VALUES or self.steps > HARD_STEPS
                or self.chars > MAX_TOTAL_CHARS)

    def build(self, schema: object, depth: int) -> Any:
        self.values += 1
        if self.exhausted or depth > HARD_DEPTH:
            return None
        resolved = self._resolve(schema, 0)
        if resolved is None:
            return None
        if not isinstance(resolved, Mapping) or not resolved:
            return self._string({})
        shallow = depth >= MAX_DEPTH or self.values >= MAX_VALUES
        if "const" in resolved:
            return resolved["const"] if _writable(resolved["const"]) else None
        if isinstance(resolved.get("enum"), list) and resolved["enum"]:
            return self._member(resolved)
        for keyword in ("anyOf", "oneOf"):
            branches = resolved.get(keyword)
            if isinstance(branches, list) and branches:
                rest = {key: value for key, value in resolved.items() if key != keyword}
                return self.build(_merge(rest, _branch(branches, shallow)), depth + 1)
        return self._typed(resolved, _type_of(resolved, shallow), depth, shallow)

    def _typed(self, schema: Mapping[str, Any], kind: str, depth: int, shallow: bool) -> Any:
        if kind == "object":
            return self._object(schema, depth, shallow)
        if kind == "array":
            return self._array(schema, depth, shallow)
        if kind in ("integer", "number"):
            return self._number(schema, integer=kind == "integer")
        if kind == "boolean":
            return bool(self.seed & 1)
        if kind == "null":
            return None
        return self._string(schema)

    def _resolve(self, schema: object, hops: int) -> Mapping[str, Any] | bool | None:
        """``schema`` with its `$ref` chain followed and its `allOf` merged in; None for a
        schema nothing conforms to (`false`, a reference that leads nowhere)."""
        while hops <= MAX_REF_HOPS and not self.exhausted:
            self.steps += 1
            if schema is False:
                return None
            if not isinstance(schema, Mapping):
                return True
            reference = schema.get("$ref")
            if not isinstance(reference, str):
                return self._merge_all_of(schema, hops)
            target = _pointer(self.root, reference)
            rest = {key: value for key, value in schema.items() if key != "$ref"}
            if target is False or (target is None and not rest):
                return None
            # An unresolvable or `true` target leaves the sibling keywords alone.
            schema = _merge(target, rest) if isinstance(target, Mapping) else rest or True
            hops += 1
        return None

    def _merge_all_of(self, schema: Mapping[str, Any], hops: int) -> Mapping[str, Any] | None:
        branches = schema.get("allOf")
        if not isinstance(branches, list):
            return schema
        merged: Mapping[str, Any] = {key: value for key, value in schema.items()
                                     if key != "allOf"}
        for branch in branches:
            resolved = self._resolve(branch, hops + 1)
            if resolved is None:
                return None
            if isinstance(resolved, Mapping):
                merged = _merge(merged, resolved)
        return merged

    def _member(self, schema: Mapping[str, Any]) -> Any:
        members = [value for value in schema["enum"] if _writable(value)] or [None]
        kinds = _types(schema)
        fitting = [value for value in members if not kinds or json_type(value) in kinds
                   or (json_type(value) == "integer" and "number" in kinds)]
        choices = fitting or members
        return choices[self.seed % len(choices)]

    def _object(self, schema: Mapping[str, Any], depth: int, shallow: bool) -> dict[str, Any]:
        properties = schema.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        required = _unique(name for name in _list(schema.get("required"))
                           if isinstance(name, str))
        names = required if shallow else required + [name for name in properties
                                                     if name not in required]
        extra = schema.get("additionalProperties", True)
        result: dict[str, Any] = {}
        for name in names:
            if self.exhausted:
                break
            result[name] = self.build(properties.get(name, extra), depth + 1)
        wanted = min(_count(schema.get("minProperties")) or 0, MAX_ITEMS)
        if extra is not False:
            for index in range(wanted + len(result)):
                if len(result) >= wanted or self.exhausted:
                    break
                name = f"{self.words[index % len(self.words)]}_{index}"
                if name not in result:
                    result[name] = self.build(extra, depth + 1)
        most = _count(schema.get("maxProperties"))
        for name in reversed(list(result)):
            if most is None or len(result) <= most:
                break
            if name not in required:
                del result[name]
        return result

    def _array(self, schema: Mapping[str, Any], depth: int, shallow: bool) -> list[Any]:
        prefix = _list(schema.get("prefixItems"))
        items = schema.get("items", True)
        if isinstance(items, list):  # draft 4 to 2019-09 spelling of prefixItems
            prefix, items = items, schema.get("additionalItems", True)
        least = _count(schema.get("minItems")) or 0
        count = least if shallow else max(least, len(prefix) or 1)
        most = _count(schema.get("maxItems"))
        if most is not None:
            count = min(count, most)
        if items is False:
            count = min(count, len(prefix))
        values: list[Any] = []
        for index in range(min(count, MAX_ITEMS)):
            if self.exhausted:
                break
            values.append(self.build(prefix[index] if index < len(prefix) else items, depth + 1))
        if schema.get("uniqueItems") is True:
            values = _without_repeats(values, least)
        return values

    def _number(self, schema: Mapping[str, Any], *, integer: bool) -> int | float:
        low, low_open = _bound(schema, "minimum", "exclusiveMinimum")
        high, high_open = _bound(schema, "maximum", "exclusiveMaximum")
        step = _positive(schema.get("multipleOf"))
        if integer:
            low = None if low is None else Fraction(math.floor(low) + 1 if low_open
                                                    else math.ceil(low))
            high = None if high is None else Fraction(math.ceil(high) - 1 if high_open
                                                      else math.floor(high))
            low_open = high_open = False
            step = Fraction(step.numerator if step is not None else 1)
        # Each number starts elsewhere, as each string does, so a record's numbers differ.
        start = Fraction((self.seed + 37 * self.numbers) % 100)
        start += 0 if integer or step else Fraction(1, 2)
        self.numbers += 1
        value = _inside(start, low, low_open, high, high_open)
        if step is not None:
            value = _on_step(value, step, low, low_open, high, high_open)
        return _written(value, integer)

    def _string(self, schema: Mapping[str, Any]) -> str:
        form = schema.get("format")
        maker = _FORMATS.get(form) if isinstance(form, str) else None
        text = maker(self) if maker is not None else self._sentence()
        least = min(_count(schema.get("minLength")) or 0, MAX_STRING_CHARS)
        text = _sized(text, least, _count(schema.get("maxLength")))
        self.chars += len(text)
        return text

    def _sentence(self) -> str:
        """The completion text for the first string, then the same words starting one word
        later for each next string, so a record's fields do not all read alike."""
        shift = self.strings % len(self.words)
        self.strings += 1
        if shift == 0:
            return self.text
        words = self.words[shift:] + self.words[:shift]
        return " ".join(words).capitalize() + "."

    def _word(self) -> str:
        return self.words[self.seed % len(self.words)]

    def _moment(self) -> datetime.datetime:
        return _EPOCH + datetime.timedelta(seconds=self.seed % (366 * 86_400))


_FORMATS: dict[str, Callable[[_Builder], str]] = {
    "date-time": lambda b: b._moment().strftime("%Y-%m-%dT%H:%M:%SZ"),
    "date": lambda b: b._moment().strftime("%Y-%m-%d"),
    "time": lambda b: b._moment().strftime("%H:%M:%SZ"),
    "duration": lambda b: f"PT{b.seed % 59 + 1}M",
    "email": lambda b: f"{b._word()}@example.com",
    "idn-email": lambda b: f"{b._word()}@example.com",
    "hostname": lambda b: f"{b._word()}.example.com",
    "idn-hostname": lambda b: f"{b._word()}.example.com",
    "ipv4": lambda b: f"192.0.2.{b.seed % 254 + 1}",
    "ipv6": lambda b: f"2001:db8::{b.seed % 0xFFFF + 1:x}",
    "uuid": lambda b: b.uuid,
    "uri": lambda b: f"https://example.com/{b._word()}",
    "url": lambda b: f"https://example.com/{b._word()}",
    "iri": lambda b: f"https://example.com/{b._word()}",
    "uri-reference": lambda b: f"https://example.com/{b._word()}",
}


def _types(schema: Mapping[str, Any]) -> list[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return [kind for kind in declared if isinstance(kind, str)]
    return []


def _type_of(schema: Mapping[str, Any], shallow: bool) -> str:
    """The type to build: the first declared one other than null (null itself once the
    depth or size limit is reached, when it is allowed), else the one the keywords imply."""
    kinds = _types(schema)
    if "null" in kinds and (shallow or kinds == ["null"]):
        return "null"
    for kind in kinds:
        if kind != "null":
            return kind
    if any(key in schema for key in ("properties", "required", "additionalProperties",
                                     "minProperties", "maxProperties")):
        return "object"
    if any(key in schema for key in ("items", "prefixItems", "minItems", "maxItems")):
        return "array"
    if any(key in schema for key in ("minimum", "maximum", "exclusiveMinimum",
                                     "exclusiveMaximum", "multipleOf")):
        return "number"
    return "string"


def _branch(branches: list[Any], shallow: bool) -> Any:
    """The first branch; once recursion must end, a null branch if there is one."""
    if shallow:
        for branch in branches:
            if isinstance(branch, Mapping) and _types(branch) == ["null"]:
                return branch
    return branches[0]


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` applied on ``base``, the properties and required lists of both kept."""
    merged = dict(base)
    for key, value in over.items():
        if key == "properties" and isinstance(value, Mapping) and isinstance(
                merged.get(key), Mapping):
            merged[key] = {**merged[key], **value}
        elif key == "required" and isinstance(value, list) and isinstance(merged.get(key), list):
            merged[key] = _unique([*merged[key], *value])
        else:
            merged[key] = value
    return merged


def _pointer(root: object, reference: str) -> object | None:
    """The schema a local reference (`#`, `#/$defs/Name`) names; None if it names none."""
    if not reference.startswith("#"):
        return None
    node = root
    path = reference[1:]
    if not path:
        return node
    if not path.startswith("/"):
        return None
    for raw in path[1:].split("/"):
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def json_type(value: object) -> str:
    """The JSON Schema type name of a decoded JSON value (a whole float is an integer)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _writable(value: object) -> bool:
    """Whether JSON can hold ``value``: a number too large for a float reads as infinity,
    which no JSON text may contain."""
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _unique(values: Any) -> list[Any]:
    seen: list[Any] = []
    for value in values:
        if value not in seen:
            seen.append(value)
    return seen


def _without_repeats(values: list[Any], least: int) -> list[Any]:
    kept = _unique(values)
    # Dropping repeats would leave fewer than minItems: keep them, the nearer miss.
    return kept if len(kept) >= least else values


def _count(value: object) -> int | None:
    """A non-negative whole number keyword (minItems, maxLength...), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and value >= 0 else None


def _exact(value: object) -> Fraction | None:
    """A JSON number as an exact fraction; None for anything else, infinity included (a
    JSON number too large for a float reads as one)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return Fraction(value)


def _positive(value: object) -> Fraction | None:
    exact = _exact(value)
    return exact if exact is not None and exact > 0 else None


def _bound(schema: Mapping[str, Any], inclusive: str, exclusive: str) -> tuple[
        Fraction | None, bool]:
    """The tighter of a bound and its exclusive form, and whether it is exclusive. Draft 4
    writes the exclusive form as a boolean that makes the bound itself exclusive."""
    bound = _exact(schema.get(inclusive))
    flag = schema.get(exclusive)
    if isinstance(flag, bool):
        return bound, flag and bound is not None
    strict = _exact(flag)
    if strict is None:
        return bound, False
    if bound is None:
        return strict, True
    tighter_strict = strict >= bound if inclusive == "minimum" else strict <= bound
    return (strict, True) if tighter_strict else (bound, False)


def _inside(value: Fraction, low: Fraction | None, low_open: bool, high: Fraction | None,
            high_open: bool) -> Fraction:
    """``value`` moved into the range: to the middle of a two-sided range, one past a
    one-sided one; to the lower bound when the range is empty, the nearest miss."""
    if _fits(value, low, low_open, high, high_open):
        return value
    if low is not None and high is not None:
        return (low + high) / 2 if low <= high else low
    if low is not None:
        return low + 1 if low_open else low
    assert high is not None  # value fits a range with neither bound
    return high - 1 if high_open else high


def _on_step(value: Fraction, step: Fraction, low: Fraction | None, low_open: bool,
             high: Fraction | None, high_open: bool) -> Fraction:
    """A multiple of ``step`` in the range: the one above ``value``, the one below, else the
    first at or past the lower bound; ``value`` itself when the range holds none."""
    candidates = [math.ceil(value / step) * step, math.floor(value / step) * step]
    if low is not None:
        candidates += [math.ceil(low / step) * step, (math.floor(low / step) + 1) * step]
    for candidate in candidates:
        if _fits(candidate, low, low_open, high, high_open):
            return Fraction(candidate)
    return value


def _fits(value: Fraction, low: Fraction | None, low_open: bool, high: Fraction | None,
          high_open: bool) -> bool:
    above = low is None or value > low or (value == low and not low_open)
    below = high is None or value < high or (value == high and not high_open)
    return above and below


def _written(value: Fraction, integer: bool) -> int | float:
    if value.denominator == 1:
        return int(value)
    if integer:
        return math.floor(value)  # only when the range held no integer: the nearest miss
    try:
        return float(value)
    except OverflowError:  # beyond a float: a huge bound, written exactly as an integer
        return math.floor(value)


def _sized(text: str, least: int, most: int | None) -> str:
    if len(text) < least:
        text = (text + " ") * (least // (len(text) + 1) + 1) if text else "x" * least
        text = text[:least]
    if most is not None and len(text) > most:
        cut = text[:most]
        text = cut.rstrip() if len(cut.rstrip()) >= least else cut
    return text
