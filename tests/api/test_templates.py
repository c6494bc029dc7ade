"""The sandboxed template module the api validates with and the engine renders with."""

from __future__ import annotations

import contextlib
import tracemalloc

import jinja2.optimizer
import pytest
from hypothesis import given
from hypothesis import strategies as st

from notifkit import templates as templates_module
from notifkit.templates import (
    RenderError,
    build_context,
    expression_error,
    render_channel,
    render_expression,
    render_string,
    template_errors,
)


def test_syntax_errors_name_channel_field_and_line() -> None:
    errors = template_errors({
        "email": {"subject": "Hi {{ user.id }}", "html": "<p>\nHello\n{{ data.x + }}</p>"},
        "push": {"title": "ok", "body": "ok", "data": {"link": "{{ }}"}},
    })
    assert [e["field"] for e in errors] == ["channels.email.html", "channels.push.data.link"]
    assert "line 3" in errors[0]["message"]
    assert "line 1" in errors[1]["message"]


def test_templates_compile_without_jinjas_optimizer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Jinja's constant folding revisits each filter's whole chain of operands, a cost that
    grows with the cube of the chain's depth: one 100-deep chain took 0.5 s to compile and a
    67 KB field of thirty-deep chains 18 s, holding the API at save and the engine at its first
    render. What it folds (constants in a tenant's template) renders as fast unfolded."""
    visited: list[object] = []

    def visit(self: object, node: object, *args: object, **kwargs: object) -> object:
        visited.append(node)
        return node

    monkeypatch.setattr(jinja2.optimizer.Optimizer, "generic_visit", visit)
    assert template_errors({"sms": {"text": "{{ data.x | upper | trim }} {{ 1 + 2 }}"}}) == []
    assert render_string("{{ 'a' | upper }}{{ 1 + 2 }}", {"data": {}}, field="f") == "A3"
    assert visited == []


def test_nesting_python_cannot_compile_is_a_render_error_not_a_crash() -> None:
    """A template stored before the save-time check, or an expression, whose generated Python
    is refused (more than 20 nested loops, 100 indentation levels, 200 nested calls) fails as
    a render error naming the field, which the preview answers as a 400 and the engine falls
    back from, instead of Python's SyntaxError."""
    loops = "{% for a in data.x %}" * 25 + "x" + "{% endfor %}" * 25
    ifs = "{% if data.x %}" * 101 + "x" + "{% endif %}" * 101
    for source in (loops, ifs):
        with pytest.raises(RenderError) as caught:
            render_string(source, {"data": {"x": []}}, field="channels.sms.text")
        assert caught.value.field == "channels.sms.text"
        assert "nested too deeply" in caught.value.message
    condition = "1 if data.a else " * 199 + "1"
    assert expression_error(condition) == "the template is nested too deeply (line 1)"
    with pytest.raises(RenderError):
        render_expression(condition, {"data": {}})
    # nesting Jinja's own parser cannot follow
    for condition in ("(" * 1000 + "1" + ")" * 1000, "not " * 5000 + "1"):
        assert expression_error(condition) == "the expression is nested too deeply"
        with pytest.raises(RenderError) as caught:
            render_expression(condition, {"data": {}})
        assert caught.value.field == "if"


def test_valid_templates_have_no_errors() -> None:
    assert template_errors({"sms": {"text": "{{ data.code }} {% if x %}y{% endif %}"}}) == []


def test_html_fields_are_autoescaped_and_text_fields_are_not() -> None:
    context = {"data": {"name": "<Ada & Bob>"}}
    out = render_channel(
        {"subject": "Hi {{ data.name }}", "html": "<b>{{ data.name }}</b>",
         "text": "{{ data.name }}"},
        "email", context,
    )
    assert out == {"subject": "Hi <Ada & Bob>", "html": "<b>&lt;Ada &amp; Bob&gt;</b>",
                   "text": "<Ada & Bob>"}


def test_nested_push_data_is_rendered_and_non_strings_kept() -> None:
    out = render_channel({"title": "t", "body": "b", "data": {"id": "{{ data.id }}", "n": 3}},
                         "push", {"data": {"id": "x1"}})
    assert out["data"] == {"id": "x1", "n": 3}


@pytest.mark.parametrize("tag", ['{% include "footer" %}', '{% extends "base" %}',
                                 '{% import "macros" as m %}', '{% from "m" import x %}'])
def test_a_template_that_needs_another_template_is_refused_at_save(tag: str) -> None:
    errors = template_errors({"email": {"subject": "Hi", "text": "Hello\n" + tag}})
    assert [e["field"] for e in errors] == ["channels.email.text"]
    assert errors[0]["message"] == (
        "a template cannot extend, include or import another template (line 2)")


def test_a_null_value_writes_nothing_in_text_and_html() -> None:
    context = {"data": {"name": None, "n": 0, "flag": False}}
    assert render_string("Hi {{ data.name }}!", context) == "Hi !"
    assert render_string("<b>{{ data.name }}</b>", context, html=True) == "<b></b>"
    # Only None: zero and false still read as themselves, and None stays testable.
    assert render_string("{{ data.n }} {{ data.flag }}", context) == "0 False"
    assert render_string("{{ 'none' if data.name is none }}", context) == "none"


def test_missing_variables_fail_loudly_naming_the_field() -> None:
    with pytest.raises(RenderError) as caught:
        render_channel({"text": "{{ data.amount }}"}, "sms", {"data": {}})
    assert caught.value.field == "channels.sms.text"
    assert render_string('{{ data.name | default("there") }}', {"data": {}}) == "there"


@pytest.mark.parametrize("source", [
    "{{ data.__class__.__mro__ }}",
    "{{ ''.__class__.__subclasses__() }}",
    "{{ data.update({'x': 1}) }}",
    "{{ 'x' * 100000000 }}",
    "{{ (9 ** 999) ** 999 }}",
    "{% for i in range(100000) %}{% for j in range(100) %}xxxxxxxxxx{% endfor %}{% endfor %}",
])
def test_the_sandbox_refuses_escapes_mutation_and_huge_output(source: str) -> None:
    with pytest.raises(RenderError):
        render_string(source, {"data": {}})


@pytest.mark.parametrize(("source", "why"), [
    # Each would otherwise hold the event loop for minutes or build gigabytes.
    ("{% for i in range(100000) %}{% for j in range(300) %}{% endfor %}{% endfor %}x",
     "loop iterations"),
    ("{% for a in data.xs %}{% for b in data.xs %}{% for c in data.xs %}{% endfor %}"
     "{% endfor %}{% endfor %}", "loop iterations"),
    ('{% set ns = namespace(s="x") %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}'
     "{% endfor %}{{ ns.s|length }}", "too large"),
    ('{{ "x"|center(2000000000) }}', "too large"),
    ('{{ "%2000000000d"|format(1) }}', "too large"),
    ('{{ "%2000000000d" % 1 }}', "too large"),
    ('{{ "%*d" % (2000000000, 1) }}', "too large"),
    ('{{ "x".ljust(2000000000) }}', "too large"),
    ('{{ "{:>2000000000}".format(1) }}', "too large"),
    ('{{ ("a" * 1000).replace("", "b" * 999000) }}', "too large"),
    ('{{ ("a" * 1000)|replace("", "b" * 999000) }}', "too large"),
    ("{{ data.xs|slice(2000000000)|list|length }}", "too large"),
    # round's 10 ** precision, computed in one call
    ("{{ 1.5|round(10000000, 'floor') }}", "round's precision"),
    ("{{ 15|round(-10000000) }}", "round's precision"),
    # codecs written in Python, quadratic in the text: a megabyte held the loop for minutes
    ("{{ ('a'*99 ~ '-' ~ 'b'*99).encode().decode('punycode') }}", "punycode codec"),
    ("{{ 'caf\u00e9'.encode('PunyCode') }}", "punycode codec"),
    ("{{ 'caf\u00e9.example'.encode(encoding='idna') }}", "idna codec"),
    # a number of millions of bits, whose division takes quadratic time in one call
    ("{{ (1).from_bytes(('x'*999999).encode(), 'big') % 7 }}", "too large"),
    # a number squared over and over: each product takes three times as long as the last,
    # the one past the time budget seconds on its own
    ("{% set ns = namespace(x=10**999) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}"
     "{% endfor %}", "too large"),
    ("{% macro d(s, n) %}{% if n %}{{ d(s ~ s, n - 1) }}{% else %}{{ s|length }}{% endif %}"
     "{% endmacro %}{{ d('x', 40) }}", "too large"),
    # Built in one call, where neither the clock nor the size check can stop it midway.
    ("{{ lipsum(100000) }}", "lipsum is limited"),
    ("{{ lipsum(1, max=100000000) }}", "lipsum is limited"),
    # 300 lines, each indented by 10^8 spaces: 30 GB, built in one json.dumps call.
    ("{{ data.xs[:300]|tojson(indent=100000000) }}", "indent may be at most"),
    ("{{ data.xs[:300]|tojson(100000000) }}", "indent may be at most"),
    # json.dumps repeats a string indent as it is: 1,000 lines of 900 kB, 0.9 GB, took 5 s
    # in one call before the size check saw the result.
    ("{{ data.xs|tojson(indent='x' * 900000) }}", "indent may be at most"),
    ("{{ data.xs[:3]|tojson(indent=' ' * 17) }}", "indent may be at most"),
    ("{{ data.xs[:3]|tojson(indent=17) }}", "indent may be at most"),
])
def test_rendering_is_bounded_in_time_and_memory(source: str, why: str) -> None:
    with pytest.raises(RenderError) as caught:
        render_string(source, {"data": {"xs": list(range(1000))}})
    assert why in caught.value.message


def test_a_render_that_outlives_its_time_budget_is_stopped() -> None:
    # Recursion without loops or large values: only the clock stops it.
    source = ("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
              "{{ f(40) }}")
    with pytest.raises(RenderError) as caught:
        render_string(source, {"data": {}})
    assert "longer than" in caught.value.message


@pytest.mark.parametrize("source", ["{{ 'abc'|truncate(-1) }}", "{{ 'abc'|truncate(1) }}"])
def test_a_filter_that_asserts_on_its_arguments_is_a_render_error(source: str) -> None:
    """Jinja's truncate asserts its length covers the ellipsis; a tenant's template must get a
    RenderError (a 400 in a preview), not an AssertionError (a 500, or a send retried to the
    DLQ). Branch conditions evaluate with the same filters."""
    with pytest.raises(RenderError):
        render_string(source, {"data": {}})
    with pytest.raises(RenderError):
        render_expression(source.strip("{} "), {"data": {}})


@pytest.mark.parametrize("source", [
    "{{ '\\ud800' }}", "{{ '%c' % 55296 }}", "a{{ '\\x00' }}b", "{{ '%c' % 0 }}",
])
def test_output_no_encoder_or_database_can_hold_is_a_render_error(source: str) -> None:
    """A template can build a lone surrogate or a NUL the API refuses in data: such output
    would break the preview's JSON answer (a 500) and the engine's stream entry or the in-app
    row (a send retried to the DLQ), so it is a RenderError naming the field."""
    with pytest.raises(RenderError) as caught:
        render_string(source, {"data": {}}, field="channels.sms.text")
    assert caught.value.field == "channels.sms.text"
    assert render_string("{{ '\\u05d0\\u200f' }}", {}) == "\u05d0\u200f"


@pytest.mark.parametrize("source", [
    "{{ ('\\t'*100).expandtabs(999999) }}",
    "{{ ('x'*100).translate({120: 'y'*999999}) }}",
    "{{ (['x'*999999]*100)|join }}",
    "{{ ''.join(['x'*999999]*100) }}",
    "{{ range(100)|join('x'*999999) }}",
    "{{ ('{0}'*100).format('x'*999999) }}",
    "{{ ('%(a)s'*100) % {'a': 'x'*999999} }}",
    "{{ (['x'*999999]*100)|string }}",
    "{% set s = 'x'*999999 %}{{ [s, s, s, s, s, s, s, s, s, s] }}",
    "{{ [" + ", ".join(["'x'*999999"] * 30) + "] }}",
    "{{ ('{:999999}'*100).format(*(['x']*100)) }}",
    "{{ ('%-999999s'*100) % (('x',)*100) }}",
    "{{ ('a '*100)|wordwrap(1, wrapstring='x'*999999) }}",
    "{% set s = 'x'*999999 %}{% set l = [s, s, s, s, s, s, s, s, s, s] %}{{ l ~ '' }}",
    # widths and precisions taken from the arguments, one huge or many wide
    "{{ '{:{}}'.format(1, 100000000) }}",
    "{{ '{:.{}f}'.format(1.0, 100000000) }}",
    "{{ '{0:{1[0]}}'.format(1, [100000000]) }}",
    "{{ '{a:{b}}'.format_map({'a': 1, 'b': 100000000}) }}",
    "{{ '{:{}}'.format(1, '>100000000') }}",
    "{{ ('{:{}}'*100).format(*((1, 999999)*100)) }}",
    "{{ ('%*d'*100) % ((999999, 1)*100) }}",
    "{{ ('%.*f'*100) % ((999999, 1.0)*100) }}",
    "{{ ('%*d'*100)|format(*((999999, 1)*100)) }}",
    # bytes and ints have sizing methods of their own
    "{{ (1).to_bytes(100000000, 'big') }}",
    "{{ (1).to_bytes(length=100000000) }}",
    "{{ 'x'.encode().ljust(100000000) }}",
    "{{ 'x'.encode().zfill(100000000) }}",
    "{{ ('x'*999999).encode() * 100 }}",
    "{{ ('\\t'*99999).encode().expandtabs(9999) }}",
    "{{ ('a'*9999).encode().replace(''.encode(), ('b'*99999).encode()) }}",
    # every line indented: the width counts once per line
    "{{ ('a\\n'*100)|indent(999999) }}",
    "{{ ('a\\n'*100)|indent(width=999999) }}",
    "{{ ('a\\n'*100)|indent('x'*999999) }}",
])
def test_output_is_refused_before_it_is_built(source: str) -> None:
    """One C call (expandtabs, translate, join, format, str of a list holding one long
    string many times) could build gigabytes before any check saw the result: a single
    preview killed the api process by exhausting memory. The size is estimated first."""
    refused_within(source, 25_000_000)


def refused_within(source: str, most: int) -> None:
    """``source`` fails as too large, having held at most ``most`` bytes at any time."""
    tracemalloc.start()
    try:
        with pytest.raises(RenderError) as caught:
            render_string(source, {"data": {}})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "too large" in caught.value.message or "builds more than" in caught.value.message
    assert peak < most


def test_a_channel_s_fields_share_one_budget() -> None:
    """Push data and a webhook body are objects of as many fields as a request carries
    (thousands): with a budget each, fields each just within it held the engine's event loop
    for minutes per send. A channel's content is one render: its fields together are within
    the loop, time and size bounds."""
    loop = "{% for i in range(60000) %}{% endfor %}x"
    assert render_string(loop, {}) == "x"
    with pytest.raises(RenderError) as caught:
        render_channel({"body": {"a": loop, "b": {"c": loop}}}, "webhook", {"data": {}})
    assert caught.value.field == "channels.webhook.body.b.c"
    assert "loop iterations" in caught.value.message
    big = "{{ 'x' * 600000 }}"
    assert len(render_string(big, {})) == 600000
    with pytest.raises(RenderError) as caught:
        render_channel({"title": big, "body": big}, "push", {"data": {}})
    assert caught.value.field == "channels.push.body"
    assert caught.value.message == ("renders past 1000000 characters with the 600000 the "
                                    "fields before it wrote")
    # each channel (each send, each preview) starts afresh
    assert render_channel({"text": loop}, "sms", {}) == {"text": "x"}
    assert render_channel({"text": loop}, "inapp", {}) == {"text": "x"}


def test_fields_that_write_nothing_still_count_against_the_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A field that writes nothing and calls nothing never reached the clock: thousands of
    them (each compiled anew when they outnumber the compile cache) held the loop for
    seconds. Each field looks at the clock before it renders."""
    monkeypatch.setattr(templates_module, "MAX_RENDER_SECONDS", 0.0)
    with pytest.raises(RenderError) as caught:
        render_channel({"body": {"a": "{% if false %}{% endif %}"}}, "webhook", {})
    assert "longer than" in caught.value.message


def test_a_long_list_used_on_every_iteration_is_measured_once() -> None:
    """Sizes are measured per render, not per call: a loop that passes the same list to a
    filter on each iteration must not walk it each time (quadratic, past the time budget)."""
    data = {"ids": list(range(5000))}
    out = render_string("{% for i in data.ids %}{{ data.ids|length }},{% endfor %}",
                        {"data": data})
    assert out.count("5000,") == 5000


def test_wordwrap_of_a_huge_text_is_refused_rather_than_holding_the_loop() -> None:
    with pytest.raises(RenderError) as caught:
        render_string("{{ ('a'*300000)|wordwrap(2) }}", {"data": {}})
    assert "wordwrap" in caught.value.message
    assert render_string("{{ 'abc def'|wordwrap(3) }}", {}) == "abc\ndef"


@pytest.mark.parametrize(("source", "why"), [
    ("{{ ('x '*30000)|urlize }}", "urlize is limited to 50000"),
    ("{{ range(60000)|list|pprint }}", "pprint is limited to 50000"),
    ("{{ ('a '*60000)|title }}", "title is limited to 100000"),
    ("{{ range(30000)|list|title }}", "title is limited to 100000"),
    # filters that call Python for every item count them as loop iterations
    ("{{ ('ab'*60000)|sort|first }}", "more than 100000 loop iterations"),
    ("{{ range(60000)|list|max }}{{ range(60000)|list|min }}", "more than 100000 loop iterations"),
    ("{% for i in range(60000) %}{% endfor %}{{ range(60000)|list|unique|first }}",
     "more than 100000 loop iterations"),
    ("{{ ('ab '*120000).split()|urlencode }}", "more than 100000 loop iterations"),
])
def test_filters_written_in_python_take_bounded_input(source: str, why: str) -> None:
    """urlize, pprint and title work word by word (item by item) in Python within one call
    the clock cannot interrupt: on a megabyte, seconds each (urlize: 8 s)."""
    with pytest.raises(RenderError) as caught:
        render_string(source, {"data": {}})
    assert why in caught.value.message
    assert render_string("{{ 'see www.example.com'|urlize }} {{ [1]|pprint }} {{ 'a b'|title }}",
                         {}).endswith("[1] A B")


def test_the_bounds_leave_ordinary_templates_alone() -> None:
    context = {"data": {"xs": list(range(1000)), "n": 3.14159, "amount": 5_000_000,
                        "tree": [{"v": 1, "c": [{"v": 2, "c": []}]}]}}
    assert render_string('{{ "%05.2f"|format(data.n) }} {{ "%d" % data.amount }} '
                         '{{ "{:>4}".format("a") }} {{ "x"|center(5) }}|', context) \
        == "03.14 5000000    a   x  |"
    digest = render_string("{% for i in data.xs %}{% if loop.last %}{{ loop.length }}"
                           "{% endif %}{% endfor %}{% for i in [] %}x{% else %}none{% endfor %}",
                           context)
    assert digest == "1000none"
    assert len(render_string("{{ lipsum(2, html=False) }}", context).split()) >= 40
    assert render_string("{{ data.tree|tojson(indent=2) }} {{ 7|tojson }}", context) \
        .startswith('[\n  {\n    "c": [')
    assert render_string("{{ [1]|tojson(indent=16) }}{{ [2]|tojson(indent='\t' * 16) }}",
                         context) == "[\n" + " " * 16 + "1\n][\n" + "\t" * 16 + "2\n]"
    assert render_string("{% for n in data.tree recursive %}{{ n.v }}{% if n.c %}"
                         "({{ loop(n.c) }}){% endif %}{% endfor %}", context) == "1(2)"


@pytest.mark.parametrize(("source", "out"), [
    # digits and asterisks in a format's own text are text, not widths
    ('{{ "**Total: %d** (order 55512345678)" % data.amount }}',
     "**Total: 5000000** (order 55512345678)"),
    ('{{ "*%s* 100%%"|format(data.amount) }}', "*5000000* 100%"),
    ('{{ "Call 0800 5551234567, ref {}".format(data.amount) }}',
     "Call 0800 5551234567, ref 5000000"),
    ('{{ "{}: {:>{}}|".format(data.amount, "a", 3) }}', "5000000:   a|"),
    ('{{ "{0:{1}.{2}f}|%*d|".format(3.14159, 6, 2) % (3, 7) }}', "  3.14|  7|"),
    ('{{ "{a:>{w}}|".format_map({"a": 1, "w": 3}) }}', "  1|"),
])
def test_formats_are_bounded_by_the_widths_they_ask_for(source: str, out: str) -> None:
    assert render_string(source, {"data": {"amount": 5_000_000}}) == out


def test_branch_expressions_treat_missing_fields_as_undefined() -> None:
    assert render_expression("data.plan == 'pro'", {"data": {}}) is False
    assert render_expression("data.a.b", {"data": {}}) is None
    assert render_expression("data.n > 3", {"data": {"n": 5}}) is True
    assert expression_error("data.x ==") is not None
    assert expression_error("steps[0] and user.id") is None


def test_context_has_the_documented_variables() -> None:
    context = build_context(
        data={"a": 1}, user={"id": "u1", "attributes": {"n": "Ada"}},
        notification={"id": "e1", "template": "t1", "campaignId": "c"}, channel="email",
        unsubscribe_url="https://x/u",
    )
    assert render_string(
        "{{ data.a }} {{ user.attributes.n }} {{ notification.template }} "
        "{{ notification.priority }} {{ channel }} {{ unsubscribeUrl }}", context,
    ) == "1 Ada t1 normal email https://x/u"
    assert "unsubscribeUrl" not in build_context(data={}, user={}, notification={},
                                                 channel="sms")


@given(st.text(max_size=200))
def test_any_text_either_renders_or_fails_with_render_error(source: str) -> None:
    """Tenants write templates: no text may crash the renderer with anything else."""
    with contextlib.suppress(RenderError):
        render_string(source, {"data": {"x": 1}, "user": {"id": "u"}})
    errors = template_errors({"sms": {"text": source}})
    assert all(e["field"] == "channels.sms.text" for e in errors)


def test_warm_compiles_what_uncompiled_lists_nested_fields_and_html_included() -> None:
    from notifkit.ids import uuid7
    from notifkit.templates import uncompiled, warm

    tag = uuid7()  # sources no earlier test compiled
    email = {"subject": f"s {tag}", "html": f"<p>{tag}</p>", "text": f"t {tag}"}
    push = {"title": f"t {tag}", "body": "{{ data.x", "data": {"deep": [f"d {tag}"]}}
    assert set(uncompiled(email, "email")) == {
        (f"s {tag}", False), (f"<p>{tag}</p>", True), (f"t {tag}", False)}
    listed = uncompiled(push, "push")
    assert set(listed) == {(f"t {tag}", False), ("{{ data.x", False), (f"d {tag}", False)}
    warm(listed)  # a field that does not compile is left for the render to report
    assert uncompiled(push, "push") == []
    with pytest.raises(RenderError):
        render_channel(push, "push", {"data": {}})
    assert uncompiled(email, "email") != []


def test_a_digest_too_large_to_print_can_still_be_counted_and_looped_over() -> None:
    # A digest's items are every trigger's data: 60 triggers of 20,000 characters pass the
    # size limit together, though each is well within it. Counting them, taking the first or
    # last, and looping over them builds nothing large; printing them all still is refused.
    items = [{"data": {"n": n, "body": "x" * 20_000}, "at": "2026-12-01T00:00:00Z"}
             for n in range(60)]
    source = ("{{ items|length }} {{ items|count }} {{ (items|first).data.n }} "
              "{{ (items|last).data.n }} {% for i in items %}{{ i.data.n }},{% endfor %}")
    assert render_string(source, {"items": items}) == (
        "60 60 0 59 " + "".join(f"{n}," for n in range(60)))
    with pytest.raises(RenderError) as caught:
        render_string("{{ items }}", {"items": items})
    assert "too large" in caught.value.message


@pytest.mark.parametrize("source", ["{{ cycler().next() }}", "{{ cycler().current }}"])
def test_an_error_of_any_kind_in_a_render_is_a_render_error(source: str) -> None:
    """Jinja's own helpers raise more than the usual exceptions (``cycler()`` without items: a
    RuntimeError): a tenant's template must get a RenderError (the preview's 400, the engine's
    generic content), never an exception the caller does not expect."""
    with pytest.raises(RenderError) as caught:
        render_string(source, {"data": {}}, field="channels.sms.text")
    assert "RuntimeError" in caught.value.message
    with pytest.raises(RenderError):
        render_expression(source.strip("{} "), {"data": {}})


@pytest.mark.parametrize(("source", "name"), [
    ("{{ data.xs|map('uppr')|join }}", "uppr"),
    ("{{ data.xs|select('od')|list }}", "od"),
    ("{{ data.xs|reject('evn')|list }}", "evn"),
    ("{{ data.xs|selectattr('a', 'eqaulto', 1)|list }}", "eqaulto"),
    ("{{ data.xs|rejectattr('a', 'nosuch')|list }}", "nosuch"),
])
def test_a_filter_or_test_named_by_a_string_must_exist_at_save(source: str, name: str) -> None:
    """``map('uppr')`` names a filter as ``| uppr`` does: it failed every send, where the
    same typo as a filter was refused when the template was saved."""
    errors = template_errors({"sms": {"text": source}})
    assert [e["field"] for e in errors] == ["channels.sms.text"]
    assert name in errors[0]["message"]
    assert "line 1" in errors[0]["message"]
    assert template_errors({"sms": {"text": (
        "{{ data.xs|map('upper')|join }}{{ data.xs|map(attribute='a')|list }}"
        "{{ data.xs|select('odd')|list }}{{ data.xs|selectattr('a', 'equalto', 1)|list }}"
        "{{ data.xs|selectattr('a')|list }}{{ data.xs|map(data.f)|list }}")}}) == []
def test_comparisons_of_long_values_are_within_the_time_budget() -> None:
    """A membership test or equality of long lists runs in one C call per comparison and
    passed no check of the clock: thousands of them held the event loop for 20 s."""
    source = ("{% set a = range(100000)|list %}{% set a = a+a+a+a+a+a+a+a+a %}"
              + "{% if -1 in a %}{% endif %}" * 3000)
    started = __import__("time").monotonic()
    with pytest.raises(RenderError) as caught:
        render_string(source, {"data": {}})
    assert "longer than" in caught.value.message
    # generous: one comparison past the deadline, not thousands
    assert __import__("time").monotonic() - started < 5


    assert render_string("{% if 'markdown' is filter %}{{ x|markdown }}{% endif %}"
                         "{{ 1 is odd }} {{ 2 in [2] }} {{ 1 < 2 < 3 }} {{ 2 is in [3] }}",
                         {}) == "True True True False"
@pytest.mark.parametrize("source", [
    "{% set s = 'x'*999999 %}{% set t = s+s+s+s+s+s+s+s+s+s %}{{ t|length }}",
    "{% set a = range(1000)|list %}{% set b = a+a+a+a+a+a+a+a+a+a %}"
    "{% set c = b+b+b+b+b+b+b+b+b+b %}{% set d = c+c+c+c+c+c+c+c+c+c+c %}{{ d|length }}",
    "{% set s = 'x'*999999 %}{{ (s ~ s)|length }}",
    "{% set s = 'x'*999999 %}{{ [" + ", ".join(["s ~ s"] * 30) + "]|length }}",
    "{% set s = 'x'*999999 %}{{ [" + ", ".join(["s + s"] * 30) + "]|length }}",
    "{% set s = 'x'*999999 %}{{ [" + ", ".join(["s + '1'"] * 30) + "]|length }}",
    "{% set s = 'x'*999999 %}{{ [" + ", ".join(f"s[{i}:]" for i in range(30)) + "]|length }}",
])
def test_adding_and_concatenating_are_bounded_like_other_operations(source: str) -> None:
    """``+`` and ``~`` built values past the size limit unchecked (the limit only looked at
    each operand), and neither they nor slices counted against what a render may build: a few
    lines of a template held gigabytes and killed the process."""
    refused_within(source, 40_000_000)


def test_adding_within_the_limits_still_works() -> None:
    source = ("{% set ns = namespace(l=[], s='') %}{% for i in range(500) %}"
              "{% set ns.l = ns.l + [i] %}{% set ns.s = ns.s + 'x' %}{% endfor %}"
              "{{ ns.l|length }} {{ ns.s|length }} {{ 1 + 2 }} {{ [1] + [2] }} {{ 'a' ~ 1 }}")
    assert render_string(source, {}) == "500 500 3 [1, 2] a1"
    assert render_string("{{ '<' ~ data.x }}", {"data": {"x": "&"}}, html=True) == "&lt;&amp;"




def test_a_template_that_does_not_compile_is_compiled_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stored template that does not compile (saved before a rule refused it) was compiled
    again for every send, on the engine's event loop: seconds per send for a large one. Why
    it does not compile is kept as its compiled form is."""
    from notifkit.ids import uuid7

    builds: list[str] = []
    build = templates_module._build

    def counted(source: str, html: bool) -> object:
        builds.append(source)
        return build(source, html)

    monkeypatch.setattr(templates_module, "_build", counted)
    source = f"{uuid7()} {{{{ data.xs|nosuch }}}}"
    templates_module.warm([(source, False)])
    assert templates_module.uncompiled({"text": source}, "sms") == []
    for _ in range(3):
        with pytest.raises(RenderError) as caught:
            render_string(source, {"data": {}})
        assert "nosuch" in caught.value.message
    assert builds == [source]


def test_the_compile_cache_is_bounded_by_the_size_of_what_it_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A compiled template takes about twenty times its text's size: 4,096 fields of 100,000
    characters (a few hundred templates a tenant may store) held 8 GB in every engine. The
    cache keeps at most a bounded total of text; what it drops is listed as uncompiled again,
    to be compiled beside the event loop."""
    import gc

    from notifkit.ids import uuid7

    assert templates_module.MAX_CACHED_CHARS == 10_000_000
    monkeypatch.setattr(templates_module, "MAX_CACHED_CHARS", 1_000_000)  # a quicker test
    tag = uuid7()
    size = 100_000
    sources = [f"{tag} {i} " + "x" * (size - 50) for i in range(80)]
    tracemalloc.start()
    try:
        templates_module.warm((source, False) for source in sources)
        gc.collect()  # a compiled template is a cycle of references
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 3_000_000  # 8,000,000 without the bound
    assert templates_module.uncompiled({"text": sources[0]}, "sms") == [(sources[0], False)]
    assert templates_module.uncompiled({"text": sources[-1]}, "sms") == []
