"""Message ids come from the seed: the same seed always names messages alike."""

from __future__ import annotations

import random
import uuid

import pytest

from simulators.state import IdSource


@pytest.mark.parametrize("seed", [0, 1, 7, 12345])
def test_message_ids_are_the_version_4_uuids_the_seed_always_gave(seed: int) -> None:
    ids = IdSource(seed)
    rng = random.Random(f"ids:{seed}")
    for _ in range(500):
        made = ids.uuid4()
        assert made == str(uuid.UUID(int=rng.getrandbits(128), version=4))
        assert uuid.UUID(made).version == 4


def test_a_new_generation_names_messages_afresh() -> None:
    assert IdSource(3).uuid4() != IdSource(3, generation=1).uuid4()
