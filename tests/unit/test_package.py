"""The package's own surface: what `import notifkit` gives an embedding program."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_the_server_is_importable_from_the_package() -> None:
    from notifkit import NotifkitServer
    from notifkit.server import NotifkitServer as Defined

    assert NotifkitServer is Defined


def test_importing_the_package_alone_loads_no_service() -> None:
    # A fresh interpreter: this one has imported the services through other tests.
    code = ("import sys, notifkit; "
            "print(sorted(m for m in sys.modules if m.startswith('notifkit.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_an_unknown_attribute_is_an_attribute_error() -> None:
    import notifkit

    with pytest.raises(AttributeError, match="NoSuchThing"):
        notifkit.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
