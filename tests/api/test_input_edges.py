"""Input a JSON parser takes but the store cannot hold: the 400 names the field, not the body."""

from __future__ import annotations

import pytest

from tests.api.conftest import Api, Project


@pytest.mark.parametrize("raw", [
    '{"attributes": {"x": 1e400}}',      # valid JSON, beyond a double
    '{"attributes": {"x": -1e400}}',
    '{"attributes": {"x": "\\ud800"}}',  # valid JSON escape, a lone surrogate
])
async def test_a_value_out_of_range_is_a_400_naming_its_field(
    api: Api, project: Project, raw: str
) -> None:
    reply = await api.call("PUT", "/v1/users/u1", key=project.full, data=raw,
                           headers={"Content-Type": "application/json"})
    assert reply.status == 400, reply.body
    assert reply.fields == ["attributes.x"]


async def test_a_key_with_a_lone_surrogate_is_a_400_naming_its_object(
    api: Api, project: Project
) -> None:
    reply = await api.call("PUT", "/v1/users/u1", key=project.full,
                           data='{"attributes": {"\\udc00": 1}}',
                           headers={"Content-Type": "application/json"})
    assert (reply.status, reply.fields) == (400, ["attributes"])


@pytest.mark.parametrize("raw", ['{"attributes": {"x": NaN}}', '{"a": Infinity}',
                                 b'{"attributes": {"x": "\xff"}}', b'\xff\xfe{\x00}\x00'])
async def test_what_is_not_json_stays_an_invalid_json_400(
    api: Api, project: Project, raw: str | bytes
) -> None:
    reply = await api.call("PUT", "/v1/users/u1", key=project.full, data=raw,
                           headers={"Content-Type": "application/json"})
    assert (reply.status, reply.fields) == (400, ["body"])
    assert reply.error["code"] == "invalid_json"


@pytest.mark.parametrize("send_at", [
    "2030-12-01T09:00:00+05:60",   # an offset's minutes run 00-59
    "2030-12-01T09:00:00-00:99",
    "2030-12-01T09:00:00+24:00",   # and its hours 00-23
    "2030-02-30T09:00:00Z",
    "2030-12-01T09:60:00Z",
    "2030-12-01",
])
async def test_a_send_at_outside_rfc_3339_is_a_400_naming_it(
    api: Api, project: Project, send_at: str
) -> None:
    await api.call("PUT", "/v1/templates/t", key=project.full,
                   json={"channels": {"sms": {"text": "hi"}}})
    reply = await api.call("POST", "/v1/notifications", key=project.send,
                           json={"to": "u1", "template": "t", "sendAt": send_at})
    assert (reply.status, reply.fields) == (400, ["sendAt"])


async def test_an_offset_in_usage_bounds_is_checked_like_send_at(
    api: Api, project: Project
) -> None:
    reply = await api.call("GET", "/v1/usage/ai", key=project.full,
                           params={"since": "2030-12-01T09:00:00+05:60"})
    assert (reply.status, reply.fields) == (400, ["since"])
    fine = await api.call("GET", "/v1/usage/ai", key=project.full,
                          params={"since": "2030-12-01T09:00:00+23:59"})
    assert fine.status == 200, fine.body
