"""Which addresses a webhook may reach: public unicast only, whatever form an address takes."""

from __future__ import annotations

import ipaddress

import pytest

from notifkit.destinations import normalise_contact, refused_host, refused_kind


@pytest.mark.parametrize(("address", "kind"), [
    ("127.0.0.1", "loopback"), ("127.255.0.9", "loopback"), ("::1", "loopback"),
    ("10.0.0.5", "private"), ("172.16.3.4", "private"), ("172.31.255.255", "private"),
    ("192.168.1.1", "private"), ("fc00::1", "private"), ("fd12:3456::1", "private"),
    ("169.254.169.254", "link-local"), ("fe80::1", "link-local"),
    ("100.64.0.1", "carrier-grade NAT"), ("100.127.255.254", "carrier-grade NAT"),
    ("224.0.0.1", "multicast"), ("239.255.255.250", "multicast"), ("ff02::1", "multicast"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"),
    ("255.255.255.255", "reserved"), ("240.0.0.1", "reserved"), ("192.0.2.7", "reserved"),
    ("198.18.0.1", "reserved"), ("2001:db8::1", "reserved"), ("100::1", "reserved"),
    # IPv6 spellings of IPv4 addresses reach the IPv4 address
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:10.0.0.5", "private"),
    ("64:ff9b::a9fe:a9fe", "link-local"), ("2002:a00:5::1", "private"),
])
def test_non_public_addresses_are_refused_by_kind(address: str, kind: str) -> None:
    assert refused_kind(ipaddress.ip_address(address)) == kind


@pytest.mark.parametrize("address", [
    "93.184.216.34", "8.8.8.8", "1.1.1.1", "100.63.255.255", "100.128.0.1", "172.32.0.1",
    "2606:4700:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808",
])
def test_public_addresses_are_allowed(address: str) -> None:
    assert refused_kind(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(("host", "kind"), [
    ("localhost", "loopback"), ("LOCALHOST.", "loopback"), ("api.localhost", "loopback"),
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("fe80::1%eth0", "link-local"),
    # Forms the C resolver reads as 127.0.0.1 and 10.0.0.5
    ("127.1", "loopback"), ("2130706433", "loopback"), ("0x7f.0.0.1", "loopback"),
    ("012.0.0.5", "private"), ("10.0.0.5.", "private"),
])
def test_hosts_naming_a_refused_address_literally_are_refused(host: str, kind: str) -> None:
    reason = refused_host(host)
    assert reason is not None
    assert kind in reason


@pytest.mark.parametrize("host", ["example.com", "hooks.cafe.de", "8.8.8.8", "deadbeef",
                                  "10.example.com"])
def test_names_and_public_addresses_are_not_refused_by_host(host: str) -> None:
    assert refused_host(host) is None


@pytest.mark.parametrize(("channel", "target", "stored"), [
    ("email", "Ada@Example.COM", "Ada@example.com"),
    ("email", "a@b@Example.COM", "a@b@example.com"),
    # A provider's receipt may name something that is no address: kept as it came, since a
    # made-up "@bad" would be an address nobody gave
    ("email", "Bad", "Bad"), ("email", "", ""),
    ("sms", "+15551234567", "+15551234567"), ("push", "Token-A", "Token-A"),
    # A URL's scheme and host are case-insensitive and 443 is https's own port; the user
    # information, path, query and fragment are the receiver's and stay as they came
    ("webhook", "HTTPS://Hooks.Example.COM/In?A=B#F", "https://hooks.example.com/In?A=B#F"),
    ("webhook", "https://Ada:PW@Example.com:443/x", "https://Ada:PW@example.com/x"),
    ("webhook", "https://Example.com:8443", "https://example.com:8443"),
    ("webhook", "https://[2001:DB8::1]:443/x", "https://[2001:db8::1]/x"),
    ("webhook", "https://example.com/", "https://example.com/"),
])
def test_only_an_e_mail_domain_and_a_url_scheme_and_host_are_respelled(
    channel: str, target: str, stored: str
) -> None:
    assert normalise_contact(channel, target) == stored


@pytest.mark.parametrize(("host", "reason"), [
    ("0.0.0.0", "0.0.0.0 is an unspecified address"),
    ("10.0.0.5", "10.0.0.5 is a private address"),
    ("localhost", "localhost is a loopback host"),
])
def test_a_refused_hosts_reason_reads_as_english(host: str, reason: str) -> None:
    assert refused_host(host) == reason
