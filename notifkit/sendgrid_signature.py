"""SendGrid's Signed Event Webhook: ECDSA (P-256, SHA-256) over the timestamp and the body.

SendGrid signs each event post with a key pair it generates; its settings page shows the
public half as the "verification key", base64 of the key's DER SubjectPublicKeyInfo. The post
carries ``X-Twilio-Email-Event-Webhook-Signature`` (base64 of a DER ECDSA signature) and
``X-Twilio-Email-Event-Webhook-Timestamp``; the signed bytes are the timestamp followed by the
raw body. Verification uses the ``cryptography`` package (the ``fcm`` extra installs it), since
an elliptic-curve signature check is not code to write ourselves.
"""

from __future__ import annotations

import base64
import binascii
import functools
from typing import Any

SIGNATURE_HEADER = "X-Twilio-Email-Event-Webhook-Signature"
TIMESTAMP_HEADER = "X-Twilio-Email-Event-Webhook-Timestamp"


@functools.lru_cache(maxsize=4)
def load_public_key(text: str) -> Any:
    """The verification key as SendGrid shows it (base64 DER, or the same as PEM). ValueError
    naming what is wrong; RuntimeError when ``cryptography`` is not installed."""
    try:
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.serialization import load_der_public_key
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise RuntimeError("needs the 'cryptography' package to check ECDSA signatures; "
                           "install notifkit[fcm] (or cryptography)") from exc
    body = "".join(line for line in text.strip().splitlines()
                   if not line.startswith("-----"))
    try:
        der = base64.b64decode("".join(body.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("must be SendGrid's verification key: base64 of the public key "
                         "(as its Mail Settings page shows it) or the same as PEM") from None
    try:
        key = load_der_public_key(der)
    except (ValueError, TypeError):
        raise ValueError("is no public key (SendGrid's verification key is base64 of an "
                         "ECDSA public key)") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise ValueError("must be an elliptic-curve (ECDSA) public key, as SendGrid's is")
    return key


def verify(key: Any, signature: str, timestamp: str, body: bytes) -> bool:
    """Whether ``signature`` (the header's base64) signs ``timestamp`` + ``body`` with ``key``."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        der = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return False
    try:
        key.verify(der, timestamp.encode() + body, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        return False
    return True
