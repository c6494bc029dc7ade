"""The hot path's Redis packer writes exactly what redis-py's would, for every argument type
the hot path sends."""

from __future__ import annotations

from enum import StrEnum

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio import Redis
from redis.exceptions import DataError

from notifkit.redis_pipe import pack

_ARG = st.one_of(
    st.binary(max_size=64), st.text(max_size=32), st.integers(),
    st.floats(allow_nan=False), st.sampled_from([b"data", "MAXLEN", "~", 10_000_000, "*"]),
)
# The first argument is a command name (redis-py splits names that contain spaces).
_COMMAND = st.tuples(st.sampled_from(["XADD", "XACK", "EVAL", "SET"]),
                     st.lists(_ARG, max_size=12)).map(lambda c: (c[0], *c[1]))


@given(st.lists(_COMMAND, min_size=1, max_size=8))
def test_pack_matches_redis_py(commands: list[tuple[object, ...]]) -> None:
    # never connects (redis-py leaves make_connection unannotated)
    connection = Redis().connection_pool.make_connection()  # type: ignore[no-untyped-call]
    assert pack(commands) == b"".join(connection.pack_commands(commands))  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [True, None, {"a": 1}, [1]])
def test_arguments_redis_cannot_take_are_refused(bad: object) -> None:
    with pytest.raises(DataError):
        pack([("SET", "k", bad)])


class _Word(StrEnum):
    SENT = "sent"


@pytest.mark.parametrize("args", [
    ("SET", "k", b"x" * 4095), ("SET", "k", b"x" * 4096), ("SET", "k", "é" * 3000),
    ("XACK", "s", "g", *[f"{n}-0" for n in range(300)]),
    ("SET", _Word.SENT, bytearray(b"v"), memoryview(b"w"), 1.5, -7),
])
def test_long_arguments_many_arguments_and_str_subclasses_match_redis_py(
    args: tuple[object, ...],
) -> None:
    connection = Redis().connection_pool.make_connection()  # type: ignore[no-untyped-call]
    assert pack([args]) == b"".join(connection.pack_commands([args]))  # type: ignore[list-item]
