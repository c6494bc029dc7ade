"""How recipients compare, for fault rules' `to` globs and the `to` filter of `/_sim/messages`.

E-mail addresses are compared ignoring case, as mail systems treat them. Every other recipient
is an identifier compared exactly: FCM registration tokens are case-sensitive (two tokens that
differ only in case are two devices), and so are OpenAI model ids; phone numbers have no case.
"""

from __future__ import annotations

import fnmatch


def is_address(recipient: str) -> bool:
    return "@" in recipient


def same_recipient(recipient: str, wanted: str) -> bool:
    if is_address(recipient):
        return recipient.lower() == wanted.lower()
    return recipient == wanted


def glob_matches(recipient: str, pattern: str) -> bool:
    if is_address(recipient):
        return fnmatch.fnmatchcase(recipient.lower(), pattern.lower())
    return fnmatch.fnmatchcase(recipient, pattern)
