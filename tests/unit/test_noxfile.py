"""``nox -s scenarios``: the suite, unless the arguments after ``--`` name scenarios."""

from __future__ import annotations

import pytest

from noxfile import scenario_arguments


@pytest.mark.parametrize(
    ("posargs", "expected"),
    [
        ([], ["run", "all"]),
        (["--seed", "7"], ["run", "all", "--seed", "7"]),
        (["--set", "messages=5", "--json", "out/r.json"],
         ["run", "all", "--set", "messages=5", "--json", "out/r.json"]),
        # Names after -- used to follow 'all', which the runner refuses beside names.
        (["malformed"], ["run", "malformed"]),
        (["malformed", "duplicate_send", "--seed", "3"],
         ["run", "malformed", "duplicate_send", "--seed", "3"]),
        (["--seed=3", "--set", "users=4", "malformed"],
         ["run", "--seed=3", "--set", "users=4", "malformed"]),
        (["all", "--seed", "2"], ["run", "all", "--seed", "2"]),
        (["list"], ["list"]),
    ],
)
def test_scenario_names_after_the_double_dash_replace_all(posargs: list[str],
                                                          expected: list[str]) -> None:
    assert scenario_arguments(posargs) == expected
