"""Template rendering: one sandboxed Jinja2 environment for every channel's content.

Public functions (the api validates and previews with them; the engine renders sends with
them):

    template_errors(channels)                 -> [{"field", "message"}] syntax errors, [] if none
    render_channel(content, channel, context) -> that channel's content, every string rendered
    render_expression(expr, context)          -> the value of a workflow branch condition
    expression_error(expr)                    -> why an expression does not compile, or None

Choices, and why:

- ``ImmutableSandboxedEnvironment``: templates are written by tenants, so they may not reach
  Python internals (``__class__``, ``mro``, ...) nor mutate the context.
- A render is bounded in time and memory, because it runs on the event loop of the api
  (previews) and the engine (every send): one template must not stall either, nor exhaust the
  process's memory. Refused: arithmetic that would build huge values (``"x" * 10**9``,
  ``9 ** 999999``, a product past :data:`MAX_RESULT_BITS`, ``int.from_bytes`` of more, ``round`` to
  more than :data:`MAX_POWER_EXPONENT` places), padding or repeating to sizes past
  :data:`MAX_OUTPUT_CHARS` (``center``, ``"%9999999d"``, ``"a".ljust(...)``, ``replace``, the
  same methods of bytes, ``int.to_bytes``), the punycode and idna codecs (quadratic), any value
  past that size however it was built (a string doubled in a loop), more than
  :data:`MAX_LOOP_ITERATIONS` loop iterations, and a render past :data:`MAX_RENDER_SECONDS`;
  output past :data:`MAX_OUTPUT_CHARS` stops the render. A render is one channel's content: its
  fields (thousands, in push data or a webhook body object) share these bounds. Sizes are
  counted as text (a list holding one long string ten times counts ten times) and estimated
  before a call that could build a large result in one step (``join``, ``format``, ``%``,
  ``expandtabs``, ``translate``, ``wordwrap``'s wrapstring, ``indent`` of many lines; a format's
  widths, ``{:{}}`` and ``%*d`` too), since a check of the result would come after the memory
  was gone. ``wordwrap`` takes at most :data:`MAX_WORDWRAP_CHARS`, as it cannot be interrupted
  (``urlize``, ``pprint`` and ``title``: :data:`MAX_SLOW_FILTER_CHARS`); a filter that calls
  Python for every item (``sort``, ``unique``, ``min``, ...) counts them as loop iterations.
  All the strings one render builds may not pass :data:`MAX_PRODUCED_CHARS` together: each is
  bounded, but many at once are not (``+``, ``~`` and slices count what they build from
  :data:`_COUNTED_FROM` up, so a text grown a line at a time is not charged for every copy).
- ``StrictUndefined``: a variable the data does not carry is an error, not an empty string. A
  notification reading "Hi , your invoice of  is paid" is worse than one that visibly failed:
  the preview shows the mistake before any send, and the engine falls back to generic content
  and records the error in the timeline. ``{{ name | default("there") }}`` and
  ``{% if data.x is defined %}`` are how a template makes a field optional. Branch
  conditions are the exception: there a missing field is simply undefined (falsy, ``None`` as a
  value), because ``data.plan == "pro"`` should be false, not an error, for data without a plan.
- Autoescaping only for HTML fields (``email.html``): escaping an SMS or a push title would
  put ``&amp;`` in front of the user.
- Compiled templates (and why one does not compile) are cached by (source, autoescape), so
  the engine compiles each distinct template text once per process, within a bound of entries
  and of their text's total size.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import functools
import operator
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from contextvars import ContextVar
from functools import lru_cache
from typing import Any, Final

from jinja2 import (
    ChainableUndefined,
    Environment,
    StrictUndefined,
    TemplateSyntaxError,
    Undefined,
    nodes,
)
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError, TemplateError, UndefinedError
from jinja2.nodes import EvalContext
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter
from jinja2.utils import generate_lorem_ipsum
from jinja2.visitor import NodeTransformer

__all__ = [
    "CHANNEL_FIELDS",
    "HTML_FIELDS",
    "RenderError",
    "build_context",
    "expression_error",
    "render_channel",
    "render_expression",
    "render_string",
    "template_errors",
    "template_strings",
]

# Each channel's content fields: required, optional. ``push.data`` and ``webhook.body`` may be
# objects, whose string values are rendered too.
CHANNEL_FIELDS: Final[dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {
    "email": (("subject",), ("html", "text")),
    "sms": (("text",), ()),
    "push": (("title", "body"), ("data",)),
    "inapp": (("text",), ("url",)),
    "webhook": (("body",), ()),
}
HTML_FIELDS: Final = frozenset({("email", "html")})
# The field a model's answer fills, per channel, when a template's ai block writes it (email's
# html is made from the same answer).
AI_WRITTEN_FIELDS: Final[dict[str, str]] = {
    "email": "text", "sms": "text", "push": "body", "inapp": "text", "webhook": "body",
}
MAX_OUTPUT_CHARS: Final = 1_000_000
MAX_POWER_EXPONENT: Final = 1000
MAX_RESULT_BITS: Final = 100_000
MAX_LOOP_ITERATIONS: Final = 100_000
MAX_RENDER_SECONDS: Final = 0.5
MAX_LIPSUM_WORDS: Final = 10_000
MAX_JSON_INDENT: Final = 16
MAX_WORDWRAP_CHARS: Final = 100_000
# Filters that work word by word (item by item) in Python in one call the clock cannot
# interrupt, and the most text each takes: on a megabyte, urlize took 8 s.
MAX_SLOW_FILTER_CHARS: Final = {"urlize": 50_000, "pprint": 50_000, "title": 100_000}
MAX_PRODUCED_CHARS: Final = 20 * MAX_OUTPUT_CHARS
_CACHE_SIZE: Final = 4096
MAX_CACHED_CHARS: Final = 10_000_000
_SLOW_CODECS: Final = frozenset({"punycode", "idna"})
# The shortest string or sequence ``+``, ``~`` or a slice builds that counts as produced.
_COUNTED_FROM: Final = 10_000

# Filters and str methods whose integer arguments set the size of what they build.
_SIZING_FILTERS: Final = frozenset({"center", "indent", "wordwrap", "truncate", "batch", "slice"})
_SIZING_METHODS: Final = frozenset({"ljust", "rjust", "center", "zfill", "expandtabs"})
# A %-format's conversion: its width and precision (digits, or ``*`` when taken from the
# arguments). Digits and asterisks in the format's own text are text.
_CONVERSION: Final = re.compile(r"%(?:%|(?:\([^)]*\))?[#0\- +]*(\*|\d*)(?:\.(\*|\d*))?[hlL]?.)")
# A str.format field's width and precision, once nested fields are filled in.
_SPEC_SIZE: Final = re.compile(r"(?:.?[<>=^])?[-+ ]?z?#?0?(\d*)[,_]?(?:\.(\d+))?")
# Filters that call Python for every item (a key function, a quote): each item counts as a
# loop iteration (a megabyte string sorted: 3 s in one call).
_ITEM_FILTERS: Final = frozenset({"sort", "unique", "min", "max", "groupby", "dictsort",
                                  "urlencode", "xmlattr", "sum"})
# Filters that only measure their input or pick one element of it: they build nothing from
# it, so an input past the size limit (a digest's items, each within it) is no reason to
# refuse them; what they return is still checked.
_MEASURING_FILTERS: Final = frozenset({"length", "count", "first", "last"})
# The filter every for-loop's iterable passes through (see _compile).
_LOOP_FILTER: Final = "nk_loop_budget"
# The filter every operand of ``~`` passes through (see _compile).
_SIZE_FILTER: Final = "nk_bounded"
# The filter the first operand of every comparison and test passes through (see _compile).
_TICK_FILTER: Final = "nk_tick"
# The filter every slice passes through (see _compile).
_BUILT_FILTER: Final = "nk_built"


class _Budget:
    """What one render may still spend (see the module docstring)."""

    __slots__ = ("deadline", "iterations", "produced", "sizes", "written")

    def __init__(self) -> None:
        self.deadline = time.monotonic() + MAX_RENDER_SECONDS
        self.iterations = 0
        self.produced = 0
        self.written = 0  # output of the fields rendered so far
        # Text sizes of the collections already measured, by id (the object is kept so the
        # id stays its own): a loop passing the same long list to a filter on every
        # iteration would otherwise walk it every time. The sandbox is immutable, so a
        # collection's size cannot change during the render.
        self.sizes: dict[int, tuple[Any, int]] = {}

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise SecurityError(f"the template took longer than {MAX_RENDER_SECONDS:g} s "
                                "to render")

    def produce(self, value: Any) -> Any:
        """Count a string an operation built: each is bounded, but a list literal of many
        ``'x' * 999999`` would otherwise hold gigabytes at once."""
        if isinstance(value, str):
            self.spend(len(value))
        return value

    def spend(self, size: int) -> None:
        self.produced += size
        if self.produced > MAX_PRODUCED_CHARS:
            raise SecurityError(f"the template builds more than {MAX_PRODUCED_CHARS} "
                                "characters")

    def iterate(self, iterable: Iterable[Any]) -> Iterator[Any]:
        for item in iterable:
            self.count(1)
            if not self.iterations & 255:
                self.tick()
            yield item

    def count(self, iterations: int) -> None:
        self.iterations += iterations
        if self.iterations > MAX_LOOP_ITERATIONS:
            raise SecurityError(f"more than {MAX_LOOP_ITERATIONS} loop iterations")


_budget: ContextVar[_Budget | None] = ContextVar("template_budget", default=None)


def _tick() -> None:
    budget = _budget.get()
    if budget is not None:
        budget.tick()


def _logical_size(value: Any, limit: int = MAX_OUTPUT_CHARS) -> int:
    """How many characters ``value`` spells out once turned into text, counted only until
    ``limit`` is passed. A list holding one long string many times costs little memory but
    ``str()``, ``join`` or ``format`` write every copy, so a check on ``len`` alone lets a
    template build gigabytes in one C call before any size check sees the result."""
    if isinstance(value, str | bytes):
        return len(value)
    if isinstance(value, dict):
        return _logical_size([*value.keys(), *value.values()], limit)
    if isinstance(value, list | tuple | set | frozenset):
        total = len(value)
        for item in value:
            if total > limit:
                break
            if isinstance(item, str | bytes):  # the common items, without a call each
                total += len(item)
            elif not isinstance(item, int | float | bool | None):
                total += _logical_size(item, limit - total)
        return total
    return 0


def _ticked(value: Any) -> Any:
    _tick()
    return value


def _produced(value: Any) -> Any:
    budget = _budget.get()
    return value if budget is None else budget.produce(value)


def _bounded(value: Any) -> Any:
    """``value``, unless it is a string or collection past the size limit."""
    if _size(value) > MAX_OUTPUT_CHARS:
        raise SecurityError("the result would be too large")
    return value


def _size(value: Any) -> int:
    """``value``'s text size (:func:`_logical_size`), a collection's measured once a render."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list | tuple | dict | set | frozenset) \
            and (budget := _budget.get()) is not None:
        known = budget.sizes.get(id(value))
        if known is None or known[0] is not value:
            known = budget.sizes[id(value)] = (value, _logical_size(value))
        return known[1]
    return _logical_size(value)


def _built(value: Any) -> Any:
    """Count a string or sequence ``+``, ``~`` or a slice built, when it is long, against
    :data:`MAX_PRODUCED_CHARS`: each is within the size limit, but a list literal of many
    ``s ~ s`` held gigabytes at once. Short ones are not counted, so a text or list grown a
    little at a time in a loop (``ns.text ~ line``) is not charged for every copy."""
    if isinstance(value, str | bytes | bytearray | list | tuple) \
            and len(value) >= _COUNTED_FROM and (budget := _budget.get()) is not None:
        budget.spend(len(value))
    return value


def _concat(join: Callable[[Iterable[Any]], str], operands: tuple[Any, ...]) -> str:
    """``a ~ b ~ ...``: each operand is within the size limit, but together they may not be;
    the total is measured before anything is joined, as text (a list is written out)."""
    texts: list[Any] = []
    total = 0
    for operand in operands:
        text = operand if isinstance(operand, str) else str(operand)
        total += len(text)
        if total > MAX_OUTPUT_CHARS:
            raise SecurityError("the result would be too large")
        texts.append(text)
    result: str = _built(_bounded(join(texts)))  # escaping (html fields) lengthens it
    return result


def _written(value: Any) -> Any:
    """What ``{{ value }}`` writes: nothing for None (an unset timezone or campaign id would
    otherwise read "None" in a customer's message), else the value within the size limit."""
    return "" if value is None else _bounded(value)


def _refuse_amplifying(owner: str | bytes | bytearray, name: str, args: tuple[Any, ...],
                       kwargs: Mapping[str, Any]) -> None:
    """Refuse a str method whose result would pass the size limit, before it is built."""
    values = [*args, *kwargs.values()]
    size = 0
    if name == "expandtabs":
        width = values[0] if values else 8
        tabs = owner.count("\t") if isinstance(owner, str) else owner.count(b"\t")
        size = len(owner) + tabs * width if isinstance(width, int) else 0
    elif name == "translate" and values and isinstance(values[0], Mapping):
        longest = max((_logical_size(v) for v in values[0].values()), default=1)
        size = len(owner) * max(longest, 1)
    elif name == "join" and values:
        items = list(values[0]) if isinstance(values[0], Iterable) else []
        size = _logical_size(items) + len(owner) * len(items)
    elif name in ("format", "format_map") and isinstance(owner, str):
        # each field may write the longest argument; widths: see _FieldWidths
        size = len(owner) + owner.count("{") * max(map(_logical_size, values), default=0)
    if size > MAX_OUTPUT_CHARS:
        raise SecurityError("the result would be too large")


def _format_size(fmt: Any, args: Iterable[Any]) -> int:
    """An upper bound of a %-format's result: each conversion may write the longest argument
    and pad to its width or precision, which may be taken from the arguments (``%*d``: the
    largest number they hold, once per ``*``)."""
    if not isinstance(fmt, str):
        return 0
    args = list(args)
    longest = max((_logical_size(a) for a in args), default=0)
    conversions = _CONVERSION.findall(fmt)
    sizes = [size for conversion in conversions for size in conversion if size]
    stars = sizes.count("*")
    if any(len(size) > 6 for size in sizes):  # 10**6 or more: int() of a huge one is slow
        return MAX_OUTPUT_CHARS + 1
    widths = sum(int(size) for size in sizes if size != "*")
    return len(fmt) + len(conversions) * longest + widths \
        + (stars * _largest_int(args) if stars else 0)


def _largest_int(value: Any) -> int:
    """The largest integer ``value`` holds, in itself or its items (``%(a)*d`` reaches a
    mapping's); ``value`` is already within the size limit."""
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value)
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, list | tuple | set | frozenset):
        return max((_largest_int(item) for item in value), default=0)
    return 0


class _FieldWidths(SandboxedFormatter):
    """Walks a str.format as it will run (fields looked up through the sandbox, nested specs
    such as ``{:{}}`` filled in) without writing anything, adding up the widths and
    precisions its fields ask for: a width taken from an argument is known only then, and
    str.format builds every field before its result could be measured."""

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        self.total = 0

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        return value

    def format_field(self, value: Any, format_spec: str) -> Any:
        sized = _SPEC_SIZE.match(format_spec)
        if sized is not None:
            self.total += int(sized[1] or 0) + int(sized[2] or 0)
        if self.total > MAX_OUTPUT_CHARS:
            raise SecurityError("the result would be too large")
        # A nested field's value becomes part of its parent's spec (``{:{}}`` of 8 or of
        # ">8"). The rest is thrown away, and within the size already estimated.
        return str(value) if isinstance(value, int | str) else ""


def _refuse_sizes(args: Iterable[Any]) -> None:
    for arg in args:
        if isinstance(arg, int) and not isinstance(arg, bool) and arg > MAX_OUTPUT_CHARS:
            raise SecurityError("the result would be too large")


def _bounded_lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> Any:
    """Jinja's ``lipsum`` global, refused past :data:`MAX_LIPSUM_WORDS`: it builds its text in
    one call, so neither the clock nor the size check would stop ``lipsum(100000)`` before it
    had held the event loop for seconds."""
    if isinstance(n, int) and isinstance(max, int) and n * max > MAX_LIPSUM_WORDS:
        raise SecurityError(f"lipsum is limited to {MAX_LIPSUM_WORDS} words")
    return generate_lorem_ipsum(n, html, min, max)


def _refuse_slow_codec(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Punycode (and IDNA, built on it) are written in Python and quadratic in the text: one
    ``decode('punycode')`` of a megabyte holds the event loop for minutes."""
    encoding = kwargs.get("encoding", args[0] if args else "utf-8")
    with contextlib.suppress(LookupError, TypeError):  # the call itself says what is wrong
        codec = codecs.lookup(encoding).name
        if codec in _SLOW_CODECS:
            raise SecurityError(f"the {codec} codec is not available in templates")


def _refuse_big_replace(text: Any, old: Any, new: Any) -> None:
    """``replace`` of str (or of bytes: ``''.encode()``) writes ``new`` at every match."""
    kinds = {str if isinstance(v, str) else bytes if isinstance(v, bytes | bytearray) else None
             for v in (text, old, new)}
    if len(kinds) == 1 and None not in kinds \
            and (text.count(old) + 1) * len(new) + len(text) > MAX_OUTPUT_CHARS:
        raise SecurityError("the result would be too large")


class RenderError(ValueError):
    """Rendering failed; ``field`` is the content path (e.g. ``channels.email.subject``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


# Filters whose argument names another filter or test: (which, the argument's position).
_NAMED_BY_ARGUMENT: Final = {"map": ("filter", 0), "select": ("test", 0), "reject": ("test", 0),
                             "selectattr": ("test", 1), "rejectattr": ("test", 1)}


class _CodeGenerator(CodeGenerator):
    """Refuses a filter or test the environment lacks wherever it stands. Jinja leaves one
    inside ``{% if %}`` or ``x if c else y`` to the render, for templates that ask first
    whether a filter exists: here the filters are fixed, so a misspelt one there (the VIP
    paragraph's ``| uper``) would be saved and fail every send that reaches it. A name the
    template itself asks about (``{% if 'markdown' is filter %}``) is still left to the
    render."""

    def visit_Template(self, node: nodes.Template, frame: Frame | None = None) -> None:
        self._asked = {(test.name, test.node.value) for test in node.find_all(nodes.Test)
                       if test.name in ("filter", "test") and isinstance(test.node, nodes.Const)}
        super().visit_Template(node, frame)

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        # Jinja joins the operands of ``~`` at once; _concat measures them first.
        if frame.eval_ctx.volatile:
            join = "(markup_join if context.eval_ctx.volatile else str_join)"
        else:
            join = "markup_join" if frame.eval_ctx.autoescape else "str_join"
        self.write(f"environment.bounded_concat({join}, (")
        for operand in node.nodes:
            self.visit(operand, frame)
            self.write(", ")
        self.write("))")

    def visit_Filter(self, node: nodes.Filter, frame: Frame) -> None:
        self._known("filter", node.name, self.environment.filters, node.lineno)
        # A filter or test named by a string: ``map('upper')``, ``select('odd')``,
        # ``selectattr('a', 'equalto', 1)``. A typo there fails every render as ``| uppr`` would.
        named = _NAMED_BY_ARGUMENT.get(node.name)
        if named is not None:
            kind, index = named
            argument = node.args[index] if len(node.args) > index else None
            if isinstance(argument, nodes.Const) and isinstance(argument.value, str):
                known = self.environment.filters if kind == "filter" else self.environment.tests
                self._known(kind, argument.value, known, argument.lineno)
        super().visit_Filter(node, frame)

    def visit_Test(self, node: nodes.Test, frame: Frame) -> None:
        self._known("test", node.name, self.environment.tests, node.lineno)
        super().visit_Test(node, frame)

    def _known(self, kind: str, name: str, known: Mapping[str, Any], lineno: int) -> None:
        if name not in known and (kind, name) not in self._asked:
            self.fail(f"No {kind} named {name!r}.", lineno)


# What a dict answers besides its keys (items, keys, get, ...): to a template, data and
# attributes are JSON objects, whose attributes are their fields.
_DICT_METHODS: Final[frozenset[str]] = frozenset(
    name for name in dir(dict) if not name.startswith("_"))


class _Sandbox(ImmutableSandboxedEnvironment):
    code_generator_class = _CodeGenerator
    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}
        self.filters[_LOOP_FILTER] = _loop_budget
        self.filters[_SIZE_FILTER] = _bounded
        self.filters[_TICK_FILTER] = _ticked
        self.filters[_BUILT_FILTER] = _built
        self.globals["lipsum"] = _bounded_lipsum

    # Jinja's own signature: the dunder names cannot clash with a template's keyword arguments.
    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _tick()
        for arg in (*args, *kwargs.values()):  # a macro that doubles a string per call
            _bounded(arg)
        if isinstance(__obj, Undefined) and isinstance(__obj._undefined_obj, dict) \
                and __obj._undefined_name in _DICT_METHODS:
            # A dict method read as a missing field (see getattr) is the method once called,
            # through the sandbox's own lookup, which refuses the ones that mutate.
            __obj = super().getattr(__obj._undefined_obj, __obj._undefined_name)
        owner = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "")
        if isinstance(owner, str | bytes | bytearray):  # ''.encode() has the same methods
            if name in ("encode", "decode"):
                _refuse_slow_codec(args, kwargs)
            if name in _SIZING_METHODS:
                _refuse_sizes([*args, *kwargs.values()])
            elif name == "replace" and len(args) >= 2:
                _refuse_big_replace(owner, args[0], args[1])
            _refuse_amplifying(owner, name, args, kwargs)
        elif isinstance(owner, int) and name == "to_bytes":
            _refuse_sizes([*args, *kwargs.values()])
        elif isinstance(owner, type) and issubclass(owner, int) and name == "from_bytes" \
                and args \
                and _logical_size(args[0]) * 8 > MAX_RESULT_BITS:
            # a number of millions of bits, divided by another in one call, takes minutes
            raise SecurityError("the result would be too large")
        return _produced(_bounded(super().call(__context, __obj, *args, **kwargs)))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        # Jinja hands out its own wrapper for str.format and format_map, which call() cannot
        # recognise as a str method: the estimate is made here instead.
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        owner, name = value.__self__, value.__name__

        @functools.wraps(wrapped)
        def checked(*args: Any, **kwargs: Any) -> str:
            _refuse_amplifying(owner, name, args, kwargs)
            if "{" in owner:
                fields = _FieldWidths(self)
                if name == "format_map" and len(args) == 1 and not kwargs:
                    fields.vformat(owner, (), args[0])
                else:
                    fields.vformat(owner, args, kwargs)
            result: str = _produced(wrapped(*args, **kwargs))
            return result

        return checked

    def getattr(self, obj: Any, attribute: str) -> Any:
        _tick()
        if isinstance(obj, dict) and isinstance(attribute, str):
            if attribute in obj:
                # A caller's field named like a dict method (an order's ``data.items``) is
                # the field; Jinja would hand out the method.
                return _bounded(obj[attribute])
            if attribute in _DICT_METHODS:
                # Without the field it is a missing field, as any other name is: the method
                # was true, defined and written as "<built-in method items ...>", so
                # ``{% if data.items %}`` held for data without items. Called
                # (``data.items()``), it is the method: see call.
                return self.undefined(obj=obj, name=attribute)
        return _bounded(super().getattr(obj, attribute))

    def getitem(self, obj: Any, argument: Any) -> Any:
        _tick()
        if isinstance(obj, dict) and isinstance(argument, str) and argument not in obj \
                and argument in _DICT_METHODS:  # data['items']: Jinja falls back on getattr
            return self.undefined(obj=obj, name=argument)
        return _bounded(super().getitem(obj, argument))

    @staticmethod
    def bounded_concat(join: Callable[[Iterable[Any]], str], operands: tuple[Any, ...]) -> str:
        # (Jinja's own ``concat`` is the join of a template's output.)
        return _concat(join, operands)

    def call_binop(self, context: Context, operator_: str, left: Any, right: Any) -> Any:
        _tick()
        if operator_ == "%":
            values = right if isinstance(right, tuple | list) else (right,)
            if _format_size(left, (*values, *(right.values() if isinstance(right, Mapping)
                                              else ()))) > MAX_OUTPUT_CHARS:
                raise SecurityError("the result would be too large")
            return _produced(_bounded(operator.mod(left, right)))
        if operator_ == "**":
            if isinstance(right, int | float) and abs(right) > MAX_POWER_EXPONENT:
                raise SecurityError("exponent too large")
            if isinstance(left, int) and isinstance(right, int) \
                    and left.bit_length() * right > MAX_RESULT_BITS:
                raise SecurityError("the result would be too large")
            return operator.pow(left, right)
        if operator_ == "+":
            # Two sequences (of one kind: else the addition itself says what is wrong). What
            # it costs is their lengths; whoever writes the result out measures it as text.
            if isinstance(left, str | bytes | bytearray | list | tuple) \
                    and isinstance(right, Sized) and len(left) + len(right) > MAX_OUTPUT_CHARS:
                raise SecurityError("the result would be too large")
            return _built(super().call_binop(context, operator_, left, right))
        if operator_ == "*":
            size = _repeat_size(left, right)
            if size > MAX_OUTPUT_CHARS:
                raise SecurityError("the result would be too large")
            # A number squared in a loop: each product takes three times the last one's time.
            if isinstance(left, int) and isinstance(right, int) \
                    and left.bit_length() + right.bit_length() > MAX_RESULT_BITS:
                raise SecurityError("the result would be too large")
            return _produced(operator.mul(left, right))
        return super().call_binop(context, operator_, left, right)


def _bounded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)  # keeps jinja's pass_context / pass_environment marks
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _tick()
        if name not in _MEASURING_FILTERS:
            for arg in (*args, *kwargs.values()):  # join, string, format... write every copy
                _bounded(arg)
        if name == "wordwrap":
            _refuse_big_wordwrap(args, kwargs)
        elif name in MAX_SLOW_FILTER_CHARS:
            limit = MAX_SLOW_FILTER_CHARS[name]
            value = _subject(args)
            # urlize and title write the value out first (a list of numbers is long text)
            size = _logical_size(value, limit) if name == "pprint" or isinstance(value, str) \
                else len(str(value))
            if size > limit:
                raise SecurityError(f"{name} is limited to {limit} characters")
        elif name in _ITEM_FILTERS and (budget := _budget.get()) is not None:
            value = _subject(args)
            if isinstance(value, Sized):
                budget.count(len(value))
        elif name == "indent":
            _refuse_big_indent(args, kwargs)
        if name in _SIZING_FILTERS:
            _refuse_sizes([*args, *kwargs.values()])
        elif name == "format":
            if args and _format_size(args[0], [*args[1:], *kwargs.values()]) > MAX_OUTPUT_CHARS:
                raise SecurityError("the result would be too large")
        elif name == "round":
            # (value, precision, method): 10 ** precision, in one call
            precision = kwargs.get("precision", args[1] if len(args) > 1 else 0)
            if isinstance(precision, int) and abs(precision) > MAX_POWER_EXPONENT:
                raise SecurityError(f"round's precision may be at most {MAX_POWER_EXPONENT}")
        elif name == "tojson":
            # (eval_ctx, value, indent): the indent is repeated on every line of the output,
            # as that many spaces or as the string given (json.dumps takes both).
            indent = kwargs.get("indent", args[2] if len(args) > 2 else None)
            width = len(indent) if isinstance(indent, str) else indent
            if isinstance(width, int) and width > MAX_JSON_INDENT:
                raise SecurityError(f"tojson's indent may be at most {MAX_JSON_INDENT}")
        elif name == "join" and len(args) >= 2 and isinstance(args[1], Iterable):
            items = list(args[1])
            sep = kwargs.get("d", args[2] if len(args) > 2 else "")
            if _logical_size(items) + len(str(sep)) * len(items) > MAX_OUTPUT_CHARS:
                raise SecurityError("the result would be too large")
            args = (args[0], items, *args[2:])
        elif name == "replace":
            strings = [a for a in args if isinstance(a, str)]
            if len(strings) >= 3:
                _refuse_big_replace(*strings[:3])
        return _produced(_bounded(func(*args, **kwargs)))

    return bounded


def _refuse_big_indent(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """``indent(s, width, ...)`` writes the width (spaces, or the string given) on every line:
    a width under the limit times many lines is built in one join."""
    text = str(args[0]) if args else ""
    width = kwargs.get("width", args[1] if len(args) > 1 else 4)
    each = width if isinstance(width, int) else len(str(width))
    if len(text) + (text.count("\n") + 1) * max(each, 0) > MAX_OUTPUT_CHARS:
        raise SecurityError("the result would be too large")


def _subject(args: tuple[Any, ...]) -> Any:
    """A filter's value: its first argument after the environment or context Jinja passes."""
    rest = args[1:] if args and isinstance(args[0], Environment | EvalContext) else args
    return rest[0] if rest else ""


def _refuse_big_wordwrap(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """``wordwrap(environment, s, width, break_long_words, wrapstring, ...)``: textwrap holds
    the loop for seconds on a megabyte (no tick runs meanwhile), and every line break writes
    the wrapstring (at most one break per character)."""
    text = str(args[1]) if len(args) > 1 else ""
    if len(text) > MAX_WORDWRAP_CHARS:
        raise SecurityError(f"wordwrap is limited to {MAX_WORDWRAP_CHARS} characters")
    wrap = kwargs.get("wrapstring", args[4] if len(args) > 4 else None)
    if isinstance(wrap, str) and len(text) * (1 + len(wrap)) > MAX_OUTPUT_CHARS:
        raise SecurityError("the result would be too large")


def _loop_budget(iterable: Any) -> Any:
    budget = _budget.get()
    return iterable if budget is None else budget.iterate(iterable)


def _repeat_size(left: Any, right: Any) -> int:
    for seq, count in ((left, right), (right, left)):
        if isinstance(seq, str | bytes | bytearray | list | tuple) and isinstance(count, int):
            return _logical_size(seq) * max(count, 0)
    return 0


def _environment(autoescape: bool, undefined: type[Any] = StrictUndefined,
                 sandbox: type[_Sandbox] = _Sandbox) -> _Sandbox:
    return sandbox(
        undefined=undefined, autoescape=autoescape, keep_trailing_newline=True,
        auto_reload=False, finalize=_written,  # {{ value }} writes every copy a list holds
        # Jinja's constant folding costs the cube of a filter chain's depth at compile time
        # (a tenant's 67 KB field: 18 s) and folds nothing a template renders slower without.
        optimized=False,
    )


class _Missing(ChainableUndefined):
    """A field a branch condition reads but the data, user or steps lack. It is false, as
    README's workflow section says: an ordering comparison with it is false (``data.count >
    3`` and ``data.count <= 3`` alike, as ``==`` already is), ``|int`` and ``|float`` read it
    as 0, and ``is none`` holds for it as for a null (a step that never ran, say the other
    branch's, reads like a timed-out waitForEvent)."""

    __slots__ = ()

    # Undefined types these as raising (Never); here they answer.
    def __lt__(self, other: Any) -> bool:  # type: ignore[override]
        return False

    __le__ = __gt__ = __ge__ = __lt__  # type: ignore[assignment]

    def __int__(self) -> int:  # type: ignore[override]
        return 0

    def __float__(self) -> float:  # type: ignore[override]
        return 0.0


def _is_none(value: Any) -> bool:
    return value is None or isinstance(value, Undefined)


_ORDERING: Final[dict[str, Callable[[Any, Any], Any]]] = {
    "lt": operator.lt, "lteq": operator.le, "gt": operator.gt, "gteq": operator.ge,
}
_COMPARISONS: Final[dict[str, Callable[[Any, Any], Any]]] = {
    **_ORDERING, "eq": operator.eq, "ne": operator.ne,
    "in": lambda a, b: a in b, "notin": lambda a, b: a not in b,
}


def _compare(left: Any, ops: tuple[tuple[str, Any], ...]) -> Any:
    """A branch condition's comparison (``a < b``, or a chain ``a < b < c``). An ordering
    comparison with a null is false, as with a missing field (_Missing): JSON has no other
    way to say a field has no value, and ``user.attributes.age >= 18`` of a user whose age
    is null should take ``else``, not fail the instance."""
    result: Any = True
    for name, right in ops:
        if name in _ORDERING and (left is None or right is None):
            return False
        result = _COMPARISONS[name](left, right)
        if not result:
            return result
        left = right
    return result


class _ExpressionCodeGenerator(_CodeGenerator):
    """Compiles comparisons to :func:`_compare` calls (operands evaluated left to right,
    each once)."""

    def visit_Compare(self, node: nodes.Compare, frame: Frame) -> None:
        self.write("environment.compare(")
        self.visit(node.expr, frame)
        self.write(", (")
        for op in node.ops:
            self.write(f"({op.op!r}, ")
            self.visit(op.expr, frame)
            self.write("), ")
        self.write("))")


class _ExpressionSandbox(_Sandbox):
    code_generator_class = _ExpressionCodeGenerator

    @staticmethod
    def compare(left: Any, ops: tuple[tuple[str, Any], ...]) -> Any:
        return _compare(left, ops)

    def unsafe_undefined(self, obj: Any, attribute: str) -> Undefined:
        # Jinja hands back an undefined that raises only when used, and _Missing is never
        # used in a way that raises: ``''.__class__`` would read as a missing field and take
        # ``else`` quietly. A template refuses it, and so does a condition.
        raise SecurityError(f"access to attribute {attribute!r} of "
                            f"{type(obj).__name__!r} object is unsafe.")


_TEXT = _environment(autoescape=False)
_HTML = _environment(autoescape=True)
_EXPRESSIONS = _environment(autoescape=False, undefined=_Missing, sandbox=_ExpressionSandbox)
_EXPRESSIONS.tests["none"] = _is_none


class _CompileCache:
    """Compiled templates, or why one does not compile, by (source, html), least recently used
    dropped first: past :data:`_CACHE_SIZE` entries, or past :data:`MAX_CACHED_CHARS` of
    source text together (a compiled template takes about twenty times its text's size, and
    a field may hold 100,000 characters). Shared by the event loop and warm()'s thread."""

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[str, bool], Any] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def __contains__(self, key: tuple[str, bool]) -> bool:
        with self._lock:
            return key in self._entries

    def get(self, key: tuple[str, bool]) -> Any:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def put(self, key: tuple[str, bool], value: Any) -> None:
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = value
            self._chars += len(key[0])
            while len(self._entries) > 1 and (len(self._entries) > _CACHE_SIZE
                                              or self._chars > MAX_CACHED_CHARS):
                (source, _html), _ = self._entries.popitem(last=False)
                self._chars -= len(source)


_cache = _CompileCache()


def _compile(source: str, html: bool) -> Any:
    key = (source, html)
    found = _cache.get(key)
    if found is None:
        try:
            found = _build(source, html)
        except TemplateSyntaxError as exc:
            # Kept, as a compiled template is: a stored template that no longer compiles
            # would otherwise be compiled again for every send, on the event loop. (Without
            # its traceback, which holds the compiler's frames.)
            found = exc.with_traceback(None)
        except RecursionError:
            found = _too_deep()
        _cache.put(key, found)
    if isinstance(found, TemplateSyntaxError):
        raise found.with_traceback(None)
    return found


def _build(source: str, html: bool) -> Any:
    env = _HTML if html else _TEXT
    tree = env.parse(source)
    # Templates are stored one by one, with no loader to find another by name: such a tag
    # would fail every render, so it is refused when the template is saved.
    for tag in tree.find_all((nodes.Extends, nodes.Include, nodes.Import, nodes.FromImport)):
        raise TemplateSyntaxError(
            "a template cannot extend, include or import another template", tag.lineno)
    # Every loop's iterable goes through the budget's counter: a loop whose body calls
    # nothing (nested loops over a range or a long list) would otherwise pass no hook at all.
    for loop in tree.find_all(nodes.For):
        loop.iter = nodes.Filter(loop.iter, _LOOP_FILTER, [], [], None, None,
                                 lineno=loop.iter.lineno)
    # ``~`` turns each operand into text without any hook: a list holding a long string many
    # times would be written out in full before the output limit could stop it.
    for concat in tree.find_all(nodes.Concat):
        concat.nodes = [nodes.Filter(operand, _SIZE_FILTER, [], [], None, None,
                                     lineno=operand.lineno) for operand in concat.nodes]
    # A slice is taken in place, with no hook: a list of many ``s[1:]`` held gigabytes.
    tree = _CountSlices().visit(tree)
    # A comparison or test runs in one C call, with no hook either: ``-1 in a`` of a list of
    # a million items, thousands of times over, held the loop for seconds between two looks
    # at the clock. Each looks at it first.
    for check in tree.find_all((nodes.Compare, nodes.Test)):
        if isinstance(check, nodes.Compare):
            check.expr = _ticking(check.expr)
        elif check.name not in ("filter", "test"):  # those ask about a name: see _CodeGenerator
            check.node = _ticking(check.node)
    try:
        return env.from_string(tree)
    except SyntaxError:
        raise _too_deep() from None


class _CountSlices(NodeTransformer):
    def visit_Getitem(self, node: nodes.Getitem) -> nodes.Node:
        self.generic_visit(node)
        if isinstance(node.arg, nodes.Slice):
            return nodes.Filter(node, _BUILT_FILTER, [], [], None, None, lineno=node.lineno)
        return node


def _ticking(node: nodes.Expr) -> nodes.Expr:
    return nodes.Filter(node, _TICK_FILTER, [], [], None, None, lineno=node.lineno)


def _bare_expression(expr: str) -> str:
    """A branch condition written as a template tag, ``{{ data.plan == 'pro' }}``, is the
    expression inside it (and ``{{`` cannot start a valid expression anyway)."""
    stripped = expr.strip()
    if stripped.startswith("{{") and stripped.endswith("}}"):
        inner = stripped[2:-2]
        if inner.startswith("-"):
            inner = inner[1:]
        if inner.endswith("-"):
            inner = inner[:-1]
        if "{{" not in inner and "}}" not in inner and inner.strip():
            return inner
    return expr


@lru_cache(maxsize=_CACHE_SIZE)
def _compile_expression(expr: str) -> Callable[..., Any]:
    try:
        return _EXPRESSIONS.compile_expression(_bare_expression(expr), undefined_to_none=True)
    except SyntaxError:
        raise _too_deep() from None


def _too_deep() -> TemplateSyntaxError:
    # Jinja parses what Python then refuses to compile from its generated code: more than 20
    # nested loops, 100 indentation levels or 200 nested calls (``{{ x|e|e|...|e }}``). That
    # is Python's SyntaxError, which no caller expects from a template.
    return TemplateSyntaxError("the template is nested too deeply", 1)


# ---------------------------------------------------------------------------------------------
# Syntax checks


def template_errors(channels: Mapping[str, Any]) -> list[dict[str, str]]:
    """A ``{"field", "message"}`` for every string in ``channels`` that does not parse.

    ``channels`` is a template's ``channels`` object; fields are reported as
    ``channels.<channel>.<field>[.<key>...]`` and messages end with the line number.
    """
    errors: list[dict[str, str]] = []
    for channel, content in channels.items():
        if isinstance(content, Mapping):
            for key, value in content.items():
                _check(value, f"channels.{channel}.{key}", errors)
    return errors


def _check(value: Any, field: str, errors: list[dict[str, str]]) -> None:
    for path, source in template_strings(value, field):
        problem = syntax_error(source)
        if problem:
            errors.append({"field": path, "message": problem})


def template_strings(value: Any, field: str) -> Iterator[tuple[str, str]]:
    """Each string of a field's value, a template, with its path: ``field`` itself, or
    ``field.key`` and ``field[index]`` inside an object (push data, a webhook body)."""
    if isinstance(value, str):
        yield field, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from template_strings(item, f"{field}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from template_strings(item, f"{field}[{index}]")


def syntax_error(source: str) -> str | None:
    """Why ``source`` is not a valid template ("... line N"), or None."""
    try:
        # Compiled, not only parsed: an unknown filter or test (``{{ x | nosuch }}``) parses
        # but fails code generation, so a template saved with one would fail every send.
        # Uncached: saving templates must not fill this process's render cache.
        _build(source, False)
    except TemplateSyntaxError as exc:
        return f"{(exc.message or 'invalid template syntax').rstrip('.')} (line {exc.lineno})"
    except (RecursionError, MemoryError):
        return "the template is nested too deeply (line 1)"
    return None


def expression_error(expr: str) -> str | None:
    """Why ``expr`` is not a valid Jinja expression, or None."""
    try:
        _compile_expression(expr)
    except TemplateSyntaxError as exc:
        return f"{(exc.message or 'invalid expression').rstrip('.')} (line {exc.lineno})"
    except (RecursionError, MemoryError):
        return "the expression is nested too deeply"
    return None


# ---------------------------------------------------------------------------------------------
# Rendering


def render_string(source: str, context: Mapping[str, Any], *, html: bool = False,
                  field: str = "template") -> str:
    """Render one template text; :class:`RenderError` names ``field`` on any failure."""
    try:
        output = _render_bounded(_compile(source, html), context)
    except TemplateSyntaxError as exc:
        raise RenderError(field, f"{exc.message} (line {exc.lineno})") from None
    except SecurityError as exc:
        raise RenderError(field, f"not allowed in a template: {exc}{_where(exc)}") from None
    except TemplateError as exc:
        raise RenderError(field, f"{exc.message or exc}{_where(exc)}") from None
    except Exception as exc:
        # Whatever else a tenant's template can make Python or Jinja raise: an AssertionError
        # (truncate(-1) asserts on its arguments), a RuntimeError (cycler() without items).
        raise RenderError(field, f"{type(exc).__name__}: {exc}{_where(exc)}") from None
    if output is None:
        raise RenderError(field, f"renders to more than {MAX_OUTPUT_CHARS} characters")
    if isinstance(output, int):
        raise RenderError(field, f"renders past {MAX_OUTPUT_CHARS} characters with the "
                                 f"{output} the fields before it wrote")
    problem = _unstorable(output)
    if problem:
        raise RenderError(field, problem)
    return output


def _where(exc: BaseException) -> str:
    """`` (line N)``: the template line a render failed on, as a syntax error names it. Jinja
    puts the template's own frames (file ``<template>``) in a render error's traceback; the
    innermost one is where it failed. Empty when none is there."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return f" (line {line})" if line else ""


def _unstorable(text: str) -> str | None:
    """Why ``text`` cannot leave the process, or None. A template can build characters the API
    refuses in data (``'\\x00'``, ``'%c' % 55296``): a lone surrogate breaks every JSON
    encoder downstream (the preview's answer, the engine's stream entry) and a NUL is refused
    by PostgreSQL (in-app rows, logs), so either would fail the send on every retry."""
    if "\x00" in text:
        return "renders a NUL character"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "renders text that is not valid Unicode (a lone surrogate)"
    return None


def _render_bounded(template: Any, context: Mapping[str, Any]) -> str | int | None:
    """Render chunk by chunk within the channel's budget (a fresh one for a lone text),
    giving up as soon as the output passes the limit: None when this text alone passes it,
    else what the fields before it wrote."""
    with _one_budget() as budget:
        budget.tick()  # a field that writes nothing and calls nothing would never look
        before = budget.written
        chunks: list[str] = []
        for chunk in template.generate(context):
            budget.written += len(chunk)
            if budget.written > MAX_OUTPUT_CHARS:
                return None if budget.written - before > MAX_OUTPUT_CHARS else before
            budget.tick()
            chunks.append(chunk)
        return "".join(chunks)


@contextlib.contextmanager
def _one_budget() -> Iterator[_Budget]:
    """The budget of the render under way, or a fresh one for as long as this lasts."""
    budget = _budget.get()
    if budget is not None:
        yield budget
        return
    token = _budget.set(budget := _Budget())
    try:
        yield budget
    finally:
        _budget.reset(token)


def uncompiled(content: Mapping[str, Any], channel: str) -> list[tuple[str, bool]]:
    """The fields of one channel's content this process has not compiled yet, as
    (source, html) pairs for :func:`warm`."""
    found: list[tuple[str, bool]] = []

    def walk(value: Any, html: bool) -> None:
        if isinstance(value, str):
            if (value, html) not in _cache:
                found.append((value, html))
        elif isinstance(value, Mapping):
            for item in value.values():
                walk(item, html)
        elif isinstance(value, list):
            for item in value:
                walk(item, html)

    for key, value in content.items():
        walk(value, (channel, key) in HTML_FIELDS)
    return found


def warm(fields: Iterable[tuple[str, bool]]) -> None:
    """Compile ``fields`` into the render cache. Compiling the largest fields takes seconds,
    so a service calls this in a thread before rendering on its event loop; a field that
    does not compile is left for the render to report."""
    for source, html in fields:
        with contextlib.suppress(TemplateError, MemoryError):
            _compile(source, html)


async def warm_beside_loop(fields: list[tuple[str, bool]]) -> None:
    """:func:`warm` in a thread (nothing to do: no thread): the event loop goes on meanwhile."""
    if fields:
        await asyncio.to_thread(warm, fields)


def render_channel(content: Mapping[str, Any], channel: str,
                   context: Mapping[str, Any]) -> dict[str, Any]:
    """One channel's content with every string field rendered (nested ones included).

    ``content`` is ``template.channels[channel]``; ``context`` holds ``data``, ``user``,
    ``notification``, ``channel`` (and ``unsubscribeUrl`` for email, ``items`` for digests).
    HTML fields are autoescaped. The fields render within one budget (time, loop iterations,
    output). Raises :class:`RenderError` naming the failing field.
    """
    out: dict[str, Any] = {}
    # One budget for all the fields: push data and a webhook body may hold thousands, each
    # of which could otherwise spend a whole budget of its own.
    with _one_budget():
        for key, value in content.items():
            html = (channel, key) in HTML_FIELDS
            out[key] = _render_value(value, context, html, f"channels.{channel}.{key}")
    return out


def _render_value(value: Any, context: Mapping[str, Any], html: bool, field: str) -> Any:
    if isinstance(value, str):
        return render_string(value, context, html=html, field=field)
    if isinstance(value, Mapping):
        return {k: _render_value(v, context, html, f"{field}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_render_value(v, context, html, f"{field}[{i}]") for i, v in enumerate(value)]
    return value


def render_expression(expr: str, context: Mapping[str, Any]) -> Any:
    """Evaluate a workflow ``branch`` condition (``data``, ``user``, ``steps`` in scope).

    Raises :class:`RenderError` (field ``if``) when it fails to compile or evaluate.
    """
    try:
        compiled = _compile_expression(expr)
    except TemplateSyntaxError as exc:
        raise RenderError("if", f"{exc.message} (line {exc.lineno})") from None
    except (RecursionError, MemoryError):  # saved before the save-time check refused it
        raise RenderError("if", "the expression is nested too deeply") from None
    token = _budget.set(_Budget())
    try:
        return compiled(**context)
    except UndefinedError:
        return None  # arithmetic on a missing field (data.count + 1 > 3): the condition is false
    except SecurityError as exc:
        raise RenderError("if", f"not allowed in an expression: {exc}") from None
    except TemplateError as exc:
        raise RenderError("if", str(exc.message or exc)) from None
    except Exception as exc:  # as in render_string
        raise RenderError("if", f"{type(exc).__name__}: {exc}") from None
    finally:
        _budget.reset(token)


def build_context(
    *,
    data: Mapping[str, Any],
    user: Mapping[str, Any],
    notification: Mapping[str, Any],
    channel: str | None,
    unsubscribe_url: str | None = None,
    items: list[Any] | None = None,
) -> dict[str, Any]:
    """The variables a template sees (API.md "Templates render with").

    ``user`` is ``{"id", "attributes", "timezone", "locale"}``; ``notification`` is
    ``{"id", "template", "priority", "campaignId"}``. ``unsubscribeUrl`` is present for email,
    ``items`` (each ``{"data", "at"}``) for a digest.
    """
    context: dict[str, Any] = {
        "data": dict(data),
        "user": {
            "id": user.get("id"),
            "attributes": user.get("attributes") or {},
            "timezone": user.get("timezone"),
            "locale": user.get("locale"),
        },
        "notification": {
            "id": notification.get("id"),
            "template": notification.get("template"),
            "priority": notification.get("priority", "normal"),
            "campaignId": notification.get("campaignId"),
        },
        "channel": channel,
    }
    if channel == "email":
        context["unsubscribeUrl"] = unsubscribe_url
    if items is not None:
        context["items"] = items
    return context
