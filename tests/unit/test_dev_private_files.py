"""``dev`` keeps the admin key and the demo's key in files only their owner may read."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from notifkit.dev import write_private


@pytest.fixture
def open_umask() -> Iterator[None]:
    """A umask that lets everyone read what is created (some shared machines set one)."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("open_umask")
def test_a_new_key_file_is_the_owners_alone_from_its_creation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "admin-key"
    seen: list[int] = []
    real_open = os.open

    def spying_open(file: str | os.PathLike[str], flags: int, mode_: int = 0o777,
                    *args: object, **kwargs: object) -> int:
        fd = real_open(file, flags, mode_)
        if Path(file) == path:
            seen.append(stat.S_IMODE(os.fstat(fd).st_mode))  # the mode when the file appears
        return fd

    monkeypatch.setattr(os, "open", spying_open)
    write_private(path, "nk_admin_secret\n")

    assert seen == [0o600]
    assert mode(path) == 0o600
    assert path.read_text() == "nk_admin_secret\n"


@pytest.mark.usefixtures("open_umask")
def test_a_key_file_anyone_could_read_is_rewritten_for_its_owner_alone(tmp_path: Path) -> None:
    path = tmp_path / "demo.json"
    path.write_text("an older, longer demo file\n")
    path.chmod(0o644)

    write_private(path, "{}\n")

    assert mode(path) == 0o600
    assert path.read_text() == "{}\n"
