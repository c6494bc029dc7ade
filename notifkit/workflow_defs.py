"""Workflow definitions: validation, step paths and branch conditions. Pure; no I/O.

A definition is the API's ``steps`` array. Every step is addressed by its *path*, its place in
the definition written with dots: top-level steps are ``"0"``, ``"1"``, ...; the steps of a
branch are ``"<branch>.then.<i>"`` and ``"<branch>.else.<i>"``, nesting as deep as branches
nest (``"3.then.1.else.0"``). A path runs at most once per instance, so it names the step's
row, its waiter, its digest window and the idempotency key of its send
(``wf:{instanceId}:{path}``).

``validate_steps(steps)`` returns one ``{"field", "message"}`` per problem, naming the step
(``steps[2].timeoutSeconds``, ``steps[3].then[0].template``): the API answers 400 with them
as the error's details.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from notifkit.templates import expression_error as compile_error
from notifkit.templates import render_expression
from notifkit.text import CONTROL_CHARS_MESSAGE, has_control_chars, identifier_problem

STEP_TYPES: tuple[str, ...] = ("send", "wait", "waitForEvent", "branch", "digest")
CHANNELS: tuple[str, ...] = ("email", "sms", "push", "inapp", "webhook")
PRIORITIES: tuple[str, ...] = ("critical", "normal", "low")
ON_TIMEOUT: tuple[str, ...] = ("continue", "stop")
BRANCHES: tuple[str, ...] = ("then", "else")
MAX_STEPS = 100  # per list
# Over all lists, branches included: every trigger copies the definition into its instance,
# and saving it compiles every branch's expression in the API's event loop.
MAX_TOTAL_STEPS = 1000
MAX_DEPTH = 8  # branches inside branches
MAX_SECONDS = 366 * 24 * 3600  # waits, timeouts and digest windows
# POST /v1/events takes names up to this long; a step waiting for a longer one could never wake.
MAX_EVENT_NAME_CHARS = 200

Path = tuple[int | str, ...]


class FieldError(TypedDict):
    field: str
    message: str


# ---------------------------------------------------------------------------------------------
# Validation


# What each step type may hold; anything else is a typo the author should hear about.
STEP_FIELDS: dict[str, frozenset[str]] = {
    "send": frozenset({"type", "template", "channels", "priority"}),
    "digest": frozenset({"type", "template", "channels", "priority", "windowSeconds"}),
    "wait": frozenset({"type", "seconds"}),
    "waitForEvent": frozenset({"type", "event", "timeoutSeconds", "onTimeout"}),
    "branch": frozenset({"type", "if", "then", "else"}),
}


def validate_steps(steps: Any) -> list[FieldError]:
    """Every problem with a definition's ``steps``; empty when it can run."""
    errors: list[FieldError] = []
    if not isinstance(steps, list):
        return [{"field": "steps", "message": "must be a list of steps"}]
    if not steps:
        return [{"field": "steps", "message": "must hold at least one step"}]
    if _count_steps(steps, MAX_TOTAL_STEPS) > MAX_TOTAL_STEPS:
        return [{"field": "steps", "message": f"may hold at most {MAX_TOTAL_STEPS} steps in "
                                              "all, those inside branches included"}]
    _validate_list(steps, "steps", 0, errors)
    return errors


def _count_steps(steps: list[Any], limit: int) -> int:
    """How many steps ``steps`` holds, branches included; stops counting past ``limit``."""
    count = 0
    pending = [steps]
    while pending and count <= limit:
        current = pending.pop()
        count += len(current)
        for step in current:
            if isinstance(step, dict):
                pending.extend(step[name] for name in BRANCHES
                               if isinstance(step.get(name), list))
    return count


def _validate_list(steps: list[Any], field: str, depth: int, errors: list[FieldError]) -> None:
    if len(steps) > MAX_STEPS:
        errors.append({"field": field, "message": f"may hold at most {MAX_STEPS} steps"})
        return
    for i, step in enumerate(steps):
        _validate_step(step, f"{field}[{i}]", depth, errors)


def _validate_step(step: Any, field: str, depth: int, errors: list[FieldError]) -> None:
    def bad(name: str, message: str) -> None:
        errors.append({"field": f"{field}.{name}" if name else field, "message": message})

    if not isinstance(step, dict):
        bad("", "must be an object with a type")
        return
    kind = step.get("type")
    if kind not in STEP_TYPES:
        bad("type", f"must be one of {', '.join(STEP_TYPES)}")
        return
    for name in step:
        if name not in STEP_FIELDS[kind]:
            bad(name, f"is not a field of a {kind} step")
    if kind in ("send", "digest"):
        template = step.get("template")
        if not isinstance(template, str) or not template:
            bad("template", "is required: the id of the template to send")
        elif problem := identifier_problem(template):
            # As PUT /v1/templates/{id} says it, and the document's Id pattern: no template
            # can have such an id.
            bad("template", problem)
        channels = step.get("channels")
        if channels is not None and (
            not isinstance(channels, list) or not channels
            or any(c not in CHANNELS for c in channels)
        ):
            bad("channels", f"must be a non-empty list of {', '.join(CHANNELS)}")
        elif channels is not None and len(set(channels)) != len(channels):
            bad("channels", "must not name a channel twice")
        if step.get("priority") is not None and step.get("priority") not in PRIORITIES:
            bad("priority", "must be critical, normal or low")
    if kind == "wait":
        _check_seconds(step, "seconds", bad)
    elif kind == "waitForEvent":
        if not _nonempty_str(step.get("event")):
            bad("event", "is required: the name of the event to wait for")
        elif len(step["event"]) > MAX_EVENT_NAME_CHARS:
            bad("event", f"may be at most {MAX_EVENT_NAME_CHARS} characters, as event names are")
        elif has_control_chars(step["event"]):
            bad("event", CONTROL_CHARS_MESSAGE)  # as an event name could never hold one
        _check_seconds(step, "timeoutSeconds", bad)
        if step.get("onTimeout") is not None and step.get("onTimeout") not in ON_TIMEOUT:
            bad("onTimeout", "must be continue or stop")
    elif kind == "digest":
        _check_seconds(step, "windowSeconds", bad)
    elif kind == "branch":
        expression = step.get("if")
        if not isinstance(expression, str) or not expression.strip():
            bad("if", "is required: a Jinja2 expression over data, user and steps")
        else:
            problem = expression_error(expression)
            if problem is not None:
                bad("if", problem)
        if depth >= MAX_DEPTH:  # depth counts the branches around this one
            bad("", f"branches may nest at most {MAX_DEPTH} deep")
            return
        for name in BRANCHES:
            children = step.get(name, [])
            if children is None:
                continue
            if not isinstance(children, list):
                bad(name, "must be a list of steps")
                continue
            _validate_list(children, f"{field}.{name}", depth + 1, errors)


def _check_seconds(step: Mapping[str, Any], name: str, bad: Any) -> None:
    value = step.get(name)
    if (
        isinstance(value, bool) or not isinstance(value, int | float)
        or (isinstance(value, float) and not math.isfinite(value)) or value <= 0
    ):
        # A value that is there but unusable is told what it must be: "is required" sent
        # callers looking for a field they had sent.
        bad(name, "is required: a number of seconds greater than 0" if value is None
            else "must be a number of seconds greater than 0")
    elif value > MAX_SECONDS:  # compared exactly: a huge int never becomes a float
        bad(name, f"may be at most {MAX_SECONDS} seconds (366 days)")


def _nonempty_str(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


# ---------------------------------------------------------------------------------------------
# Branch conditions

MAX_EXPRESSION_CHARS = 2000


def expression_error(expression: str) -> str | None:
    """Why ``expression`` does not compile, or None."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        return f"may be at most {MAX_EXPRESSION_CHARS} characters"
    # The bounded sandbox, as at run time: a plain one folds constants while compiling, so
    # ``[1] * 10**7`` or ``'a' * 10**9`` would be built (for seconds, in the API's event
    # loop) just to check the syntax.
    problem = compile_error(expression)
    return None if problem is None else f"is not a valid expression: {problem}"


def evaluate_condition(expression: str, context: Mapping[str, Any]) -> bool:
    """Evaluate a branch's ``if`` in the sandbox; undefined names are falsy."""
    return bool(render_expression(expression, dict(context)))


# ---------------------------------------------------------------------------------------------
# Paths


def format_path(path: Path) -> str:
    return ".".join(str(part) for part in path)


def parse_path(text: str) -> Path:
    parts: list[int | str] = []
    for i, token in enumerate(text.split(".")):
        if i % 2 == 0:
            parts.append(int(token))
        elif token in BRANCHES:
            parts.append(token)
        else:
            raise ValueError(f"not a step path: {text!r}")
    if len(parts) % 2 == 0:
        raise ValueError(f"not a step path: {text!r}")
    return tuple(parts)


def _list_at(steps: Sequence[Any], prefix: Path) -> Sequence[Any]:
    """The step list that ``prefix`` (a path without its last index) points into."""
    current: Sequence[Any] = steps
    for i in range(0, len(prefix), 2):
        step = current[int(prefix[i])]
        current = step.get(str(prefix[i + 1])) or []
    return current


def step_at(steps: Sequence[Any], path: Path) -> dict[str, Any]:
    step: dict[str, Any] = _list_at(steps, path[:-1])[int(path[-1])]
    return step


def first_path(steps: Sequence[Any]) -> Path | None:
    return (0,) if steps else None


def next_path(steps: Sequence[Any], path: Path) -> Path | None:
    """The step after ``path`` once it is done (leaving a branch continues after it)."""
    siblings = _list_at(steps, path[:-1])
    index = int(path[-1])
    if index + 1 < len(siblings):
        return (*path[:-1], index + 1)
    if len(path) == 1:
        return None
    return next_path(steps, path[:-2])


def enter_branch(steps: Sequence[Any], path: Path, name: str) -> Path | None:
    """The first step of a branch's ``then``/``else`` list (or what follows an empty one)."""
    children = step_at(steps, path).get(name) or []
    if children:
        return (*path, name, 0)
    return next_path(steps, path)


def top_index(path: Path) -> int:
    return int(path[0])
