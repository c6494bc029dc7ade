"""The simulators' e-mail address check: the bare-address shortcut answers exactly what the
full RFC 5322 parse answers."""

from __future__ import annotations

from email.utils import parseaddr

from hypothesis import given
from hypothesis import strategies as st

from simulators.providers.common import _EMAIL, email_address

# Letters, digits and every character RFC 5322 gives a meaning to, so the strings exercise
# quoting, comments, display names and lists as well as plain addresses.
_ALPHABET = st.sampled_from(list("abcXYZ019.-_+'!#$%&*/=?^`{|}~\\\"()<>[]@,;: \té"))


def _full_parse(value: str) -> str | None:
    _, address = parseaddr(value)
    return address if _EMAIL.match(address) else None


@given(st.text(_ALPHABET, max_size=40))
def test_any_string_gets_the_answer_of_the_full_parse(value: str) -> None:
    assert email_address(value) == _full_parse(value)


@given(st.from_regex(_EMAIL, fullmatch=True).filter(lambda s: len(s) <= 512))
def test_a_bare_address_comes_back_as_it_is(value: str) -> None:
    assert email_address(value) == _full_parse(value) == value


def test_named_addresses_and_non_addresses() -> None:
    assert email_address("notifkit <noreply@example.com>") == "noreply@example.com"
    assert email_address('"Ada, L." <ada@example.com>') == "ada@example.com"
    assert email_address("ada@example") is None
    assert email_address(42) is None
    assert email_address("a" * 510 + "@b.c") is None
