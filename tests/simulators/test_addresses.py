"""The simulators' e-mail address check: one mailbox, bare or `Name <address>`, whose address
is the one an RFC 5322 parse finds; a list or trailing text is no address."""

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
def test_an_accepted_string_has_the_address_the_full_parse_finds(value: str) -> None:
    """Stricter than parseaddr, never different: whatever is accepted is the address an RFC
    5322 parse reads from it."""
    address = email_address(value)
    assert address is None or address == _full_parse(value)


@given(st.from_regex(_EMAIL, fullmatch=True).filter(lambda s: len(s) <= 512))
def test_a_bare_address_comes_back_as_it_is(value: str) -> None:
    assert email_address(value) == _full_parse(value) == value


def test_named_addresses_and_non_addresses() -> None:
    assert email_address("notifkit <noreply@example.com>") == "noreply@example.com"
    assert email_address('"Ada, L." <ada@example.com>') == "ada@example.com"
    assert email_address("ada@example") is None
    assert email_address(42) is None
    assert email_address("a" * 510 + "@b.c") is None


def test_a_list_or_trailing_text_is_not_one_address() -> None:
    """parseaddr reads `a@b.c, d@e.f` as its first address; the providers refuse it, and a
    simulator that kept only the first would silently drop a recipient."""
    assert email_address("ada@example.com, bob@example.com") is None
    assert email_address("Ada <ada@example.com>, bob@example.com") is None
    assert email_address("Ada <ada@example.com> and more") is None
    assert email_address("ada@example.com>") is None
    assert email_address("  Ada   <ada@example.com>  ") == "ada@example.com"
    assert email_address('"Ada \\" L." <ada@example.com>') == "ada@example.com"
