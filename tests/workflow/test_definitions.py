"""Definition validation names the step at fault; step paths walk into and out of branches."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notifkit.templates import RenderError, render_string
from notifkit.text import identifier_problem
from notifkit.workflow_defs import (
    MAX_DEPTH,
    MAX_TOTAL_STEPS,
    enter_branch,
    evaluate_condition,
    format_path,
    next_path,
    parse_path,
    validate_steps,
)

GOOD = [
    {"type": "send", "template": "welcome", "channels": ["email", "push"]},
    {"type": "wait", "seconds": 86400},
    {"type": "waitForEvent", "event": "clicked", "timeoutSeconds": 3600, "onTimeout": "stop"},
    {"type": "branch", "if": "steps[2] is not none and data.plan == 'pro'",
     "then": [{"type": "send", "template": "thanks"}], "else": []},
    {"type": "digest", "windowSeconds": 600, "template": "digest"},
]


def fields(steps: object) -> list[str]:
    return [error["field"] for error in validate_steps(steps)]


def test_a_valid_definition_has_no_errors() -> None:
    assert validate_steps(GOOD) == []


def test_errors_name_the_step_and_field() -> None:
    steps = [
        {"type": "send"},
        {"type": "wait", "seconds": 0},
        {"type": "waitForEvent", "event": "", "timeoutSeconds": "soon", "onTimeout": "never"},
        {"type": "branch", "if": "data.x ==",
         "then": [{"type": "send", "template": "ok", "channels": ["fax"]}],
         "else": [{"type": "teleport"}]},
        {"type": "digest", "windowSeconds": True, "template": "d"},
        "not a step",
    ]
    assert fields(steps) == [
        "steps[0].template",
        "steps[1].seconds",
        "steps[2].event", "steps[2].timeoutSeconds", "steps[2].onTimeout",
        "steps[3].if", "steps[3].then[0].channels", "steps[3].else[0].type",
        "steps[4].windowSeconds",
        "steps[5]",
    ]
    messages = {e["field"]: e["message"] for e in validate_steps(steps)}
    assert "not a valid expression" in messages["steps[3].if"]


@pytest.mark.parametrize("value", [-1, 0, "soon", True, None])
@pytest.mark.parametrize(("kind", "name"), [
    ("wait", "seconds"), ("waitForEvent", "timeoutSeconds"), ("digest", "windowSeconds"),
])
def test_a_duration_given_but_invalid_is_not_called_missing(kind: str, name: str,
                                                           value: object) -> None:
    """A duration that is there but unusable (-1, a string) is told what it must be, not that
    it is required: "is required" sent callers looking for a field they had sent."""
    step = {"type": kind, "event": "clicked", "template": "t", name: value}
    message = {e["field"]: e["message"] for e in validate_steps([step])}[f"steps[0].{name}"]
    if value is None:
        assert message == "is required: a number of seconds greater than 0"
    else:
        assert message == "must be a number of seconds greater than 0"


def test_a_missing_duration_is_called_required() -> None:
    message = {e["field"]: e["message"]
               for e in validate_steps([{"type": "wait"}])}["steps[0].seconds"]
    assert message == "is required: a number of seconds greater than 0"


@pytest.mark.parametrize("template", [
    "x" * 256, " t", "t ", ".", "..", "a\tb", "a\x85b", "a\u200bb", "\ue000", "\u3000",
    "\ud800",
], ids=ascii)
def test_a_step_s_template_is_checked_as_a_template_id_is(template: str) -> None:
    """No template can have such an id (PUT /v1/templates/{id} refuses it), so the step names
    why, as that route would, rather than looking it up."""
    problem = identifier_problem(template)
    assert problem is not None
    for steps, field in (
        ([{"type": "send", "template": template}], "steps[0].template"),
        ([{"type": "digest", "template": template, "windowSeconds": 60}], "steps[0].template"),
        ([{"type": "branch", "if": "true", "else": [{"type": "send", "template": template}]}],
         "steps[0].else[0].template"),
    ):
        assert validate_steps(steps) == [{"field": field, "message": problem}], steps


@pytest.mark.parametrize("template", ["a b", "ü", "\U0001f600", "...", "x" * 255, "a\u0301"],
                         ids=ascii)
def test_any_template_id_may_be_a_step_s_template(template: str) -> None:
    assert validate_steps([{"type": "send", "template": template}]) == []


def test_a_condition_may_be_written_as_a_template_tag() -> None:
    """``{{ data.plan == 'pro' }}`` is how a Jinja expression is usually written; it means the
    expression inside, as validation and evaluation both read it."""
    tagged = [{"type": "branch", "if": "{{ data.plan == 'pro' }}", "then": [], "else": []}]
    assert validate_steps(tagged) == []
    assert evaluate_condition("{{ data.plan == 'pro' }}", {"data": {"plan": "pro"}}) is True
    assert evaluate_condition("{{- data.plan == 'pro' -}}", {"data": {"plan": "free"}}) is False
    assert fields([{"type": "branch", "if": "{{ }}", "then": []}]) == ["steps[0].if"]
    assert fields([{"type": "branch", "if": "{{ a }} {{ b }}", "then": []}]) == ["steps[0].if"]


def test_the_steps_must_be_a_non_empty_list() -> None:
    assert fields(None) == ["steps"]
    assert fields([]) == ["steps"]


def test_paths_enter_and_leave_branches() -> None:
    steps = [
        {"type": "send", "template": "a"},
        {"type": "branch", "if": "true",
         "then": [{"type": "send", "template": "b"}, {"type": "send", "template": "c"}],
         "else": []},
        {"type": "send", "template": "d"},
    ]
    assert next_path(steps, (0,)) == (1,)
    assert enter_branch(steps, (1,), "then") == (1, "then", 0)
    assert next_path(steps, (1, "then", 0)) == (1, "then", 1)
    assert next_path(steps, (1, "then", 1)) == (2,)
    assert enter_branch(steps, (1,), "else") == (2,)
    assert next_path(steps, (2,)) is None
    assert format_path((1, "then", 0)) == "1.then.0"
    assert parse_path("3.else.1.then.0") == (3, "else", 1, "then", 0)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
    | st.sampled_from(["send", "wait", "waitForEvent", "branch", "digest", "email", "stop"]),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(["type", "template", "channels", "seconds", "event",
                                       "timeoutSeconds", "onTimeout", "if", "then", "else",
                                       "windowSeconds", "priority"]) | st.text(max_size=5),
                      children, max_size=6),
    max_leaves=30,
)


@given(json_values)
def test_validation_never_raises_whatever_json_it_is_given(steps: object) -> None:
    """The API validates request bodies with it: any exception would be a 500."""
    errors = validate_steps(steps)
    assert all(set(e) == {"field", "message"} for e in errors)
    assert all(e["field"].startswith("steps") for e in errors)


def test_an_unknown_filter_or_test_behind_a_condition_is_refused_at_save() -> None:
    """Jinja leaves a filter inside ``x if c else y`` to the evaluation: a misspelt one would
    fail every instance whose data takes that side, long after the definition was saved."""
    for expression in ("data.plan | uper == 'PRO' if data.plan else false",
                       "false if data.y else data.x is no_such_test"):
        [error] = validate_steps([{"type": "branch", "if": expression}])
        assert error["field"] == "steps[0].if"
        assert "uper" in error["message"] or "no_such_test" in error["message"]


def test_huge_numbers_are_rejected_not_crashed_on() -> None:
    assert fields([{"type": "wait", "seconds": 10**400}]) == ["steps[0].seconds"]


def test_pathological_expressions_are_errors_not_crashes() -> None:
    for expression in ("(" * 5000, "[" * 5000, "a" * 100_000):
        [error] = validate_steps([{"type": "branch", "if": expression}])
        assert error["field"] == "steps[0].if"


def test_branches_nest_as_deep_as_the_limit_says_and_no_deeper() -> None:
    def nested(branches: int) -> list[dict[str, object]]:
        step: dict[str, object] = {"type": "send", "template": "t"}
        for _ in range(branches):
            step = {"type": "branch", "if": "true", "then": [step]}
        return [step]

    assert validate_steps(nested(MAX_DEPTH)) == []
    [error] = validate_steps(nested(MAX_DEPTH + 1))
    assert error["field"] == "steps[0]" + ".then[0]" * MAX_DEPTH
    assert str(MAX_DEPTH) in error["message"]


def test_a_definition_holds_a_bounded_number_of_steps_in_all() -> None:
    # 100 per list and 8 branches deep would allow 100**8 steps: each branch's expression is
    # compiled in the API's event loop when the definition is saved, and every trigger copies
    # the whole definition into its instance, so the count over all lists is bounded too.
    def branches(count: int) -> list[dict[str, object]]:
        return [{"type": "branch", "if": f"data.x == {i}",
                 "then": [{"type": "send", "template": "t"}]} for i in range(count)]

    per_branch = MAX_TOTAL_STEPS // 100
    assert validate_steps([{"type": "branch", "if": "true", "then": branches(per_branch // 2 - 1)}
                           for _ in range(100)]) == []
    too_many = [{"type": "branch", "if": "true", "then": branches(per_branch)}
                for _ in range(100)]
    [error] = validate_steps(too_many)
    assert error["field"] == "steps"
    assert str(MAX_TOTAL_STEPS) in error["message"]


def test_checking_an_expression_does_not_evaluate_its_constants() -> None:
    # Constant folding at compile time would build these values just to check the syntax,
    # holding the API's event loop for seconds and the memory for all of it.
    tracemalloc.start()
    try:
        for expression in ("[1] * 10**6", "'a' * 10**8", "'a' | center(10**8)"):
            assert validate_steps([{"type": "branch", "if": expression}]) == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 5_000_000, peak  # a folded constant alone would be 8 MB or 100 MB


def test_a_missing_field_is_false_in_comparisons_and_null_checks() -> None:
    """A branch over a field the data or user lacks takes ``else``: an ordering comparison
    or a number filter on it is false, not an error that fails the instance, and a step
    that never ran (the other branch's) reads as null, like a timed-out waitForEvent."""
    context = {"data": {"zero": 0}, "user": {"id": "u1", "attributes": {}},
               "steps": {0: None, "0": None}}
    for condition in ("data.count > 3", "data.count >= 3", "data.count < 3",
                      "data.count <= 3", "user.attributes.age >= 18",
                      "data.count|int > 3", "data.count|float > 0.5",
                      "data.missing + 1 > 0", "{{ data.count > 3 }}",
                      "steps['2.then.0'] is not none", "steps[5] is not none",
                      "steps[0] is not none", "data.zero", "data.count == none",
                      "steps[5] == none"):
        assert evaluate_condition(condition, context) is False, condition
    for condition in ("not data.count > 3", "steps['2.then.0'] is none", "data.count is none",
                      "data.count != none", "steps[5] is none",
                      "data.count is not defined", "data.plan != 'pro'",
                      "data.count|int == 0", "data.zero < 1"):
        assert evaluate_condition(condition, context) is True, condition


def test_an_ordering_comparison_with_a_null_is_false_as_with_a_missing_field() -> None:
    """A field present but null (``{"age": null}``, a timed-out waitForEvent's output) orders
    like a missing one: the comparison is false rather than an error that fails the
    instance. Equality, ``in`` and chains keep their meaning."""
    context = {"data": {"n": None, "m": 5, "tags": ["a"]},
               "user": {"id": "u1", "attributes": {"age": None}}, "steps": {0: None}}
    for condition in ("data.n > 3", "data.n <= 3", "3 < data.n", "user.attributes.age >= 18",
                      "steps[0] > 1", "1 < data.m < data.n", "data.n < data.m < 10",
                      "data.n == 3", "'b' in data.tags"):
        assert evaluate_condition(condition, context) is False, condition
    for condition in ("not data.n > 3", "data.n == none", "data.n is none", "data.n != 3",
                      "1 < data.m < 10", "data.m >= 5 >= 5", "'a' in data.tags",
                      "'b' not in data.tags", "data.m > 3 or data.n > 3"):
        assert evaluate_condition(condition, context) is True, condition
    # other mismatched types are still errors that fail the instance
    with pytest.raises(RenderError):
        evaluate_condition("data.tags > 3", context)


def test_a_field_named_like_a_dict_method_reads_the_field() -> None:
    """``data.items`` is the caller's ``items`` (an order's lines), not the dict's method;
    without such a field the method is still there (``data.items()``)."""
    context = {"data": {"items": [1, 2], "keys": "k", "get": 0}, "user": {}, "steps": {}}
    for condition in ("data.items | length == 2", "data.keys == 'k'", "data.get == 0",
                      "user.items() | list | length == 0"):
        assert evaluate_condition(condition, context) is True, condition
    rendered = render_string("{% for i in data.items %}{{ i }};{% endfor %}{{ data.keys }}",
                             context)
    assert rendered == "1;2;k"


def test_a_missing_field_named_like_a_dict_method_is_missing() -> None:
    """Data without ``items`` has no ``items`` field: ``data.items`` read the dict's method,
    so ``if: data.items`` took ``then`` for a trigger without items, ``{% if data.items %}``
    held (in a template it fails now, as for any missing field), ``is defined`` and
    ``default`` saw a value, and ``{{ data.items }}`` wrote
    ``<built-in method items of dict object at 0x...>``. Called, the method is still there
    (``data.items()``, ``user.attributes.get('plan', 'free')``)."""
    context = {"data": {"n": 1}, "user": {"attributes": {}}, "steps": {0: {"x": 1}}}
    for condition in ("data.items", "data.keys", "data.get", "data.values is defined",
                      "user.attributes.items", "steps[0].copy", "data['items']",
                      "data.update", "data|attr('items')"):
        assert evaluate_condition(condition, context) is False, condition
    for condition in ("data.items is none", "not data.items", "data.items | length == 0",
                      "data.items() | list | length == 1", "data.get('n') == 1",
                      "user.attributes.get('plan', 'free') == 'free'", "data['keys']() | list"):
        assert evaluate_condition(condition, context) is True, condition
    with pytest.raises(RenderError, match="not allowed in an expression"):
        evaluate_condition("data.update({'n': 2})", context)
    assert render_string(
        "{% if data.items is defined %}yes{% else %}no{% endif %} "
        "{{ data.values | default('none') }} {% for k, v in data.items() %}{{ k }}={{ v }}"
        "{% endfor %} {{ data.get('m', 0) }} {{ data['keys']() | list }}",
        {"data": {"n": 1}}) == "no none n=1 0 ['n']"
    for source in ("{{ data.items }}", "{{ data['get'] }}", "{% if data.keys %}{% endif %}",
                   "{% for i in data.items %}{% endfor %}"):
        with pytest.raises(RenderError, match="has no attribute"):
            render_string(source, {"data": {"n": 1}})


def test_an_attribute_the_sandbox_refuses_fails_the_condition() -> None:
    """``''.__class__`` is no missing field: a template refuses it, and a condition reading
    one fails (and so the instance) instead of quietly taking ``else``, whether or not the
    expression goes on to call something through it."""
    context = {"data": {"x": 1, "__class__": "field"}, "user": {"id": "u1", "attributes": {}},
               "steps": {}}
    for condition in ("''.__class__", "cycler.__init__.__globals__", "lipsum.__globals__",
                      "not ''.__class__", "''.__class__ is none", "data.x.__class__ is defined",
                      "user.attributes.__class__"):
        with pytest.raises(RenderError, match="not allowed in an expression"):
            evaluate_condition(condition, context)
    # a caller's field of that name is the field, as data.items is
    assert evaluate_condition("data.__class__ == 'field'", context) is True
