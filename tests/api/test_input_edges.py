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
