"""A Google service account with a fresh RSA key, as FCM_CREDENTIALS_FILE and firebase-admin
take it."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

CLIENT_EMAIL = "notifkit@example.iam.gserviceaccount.com"


def service_account(token_uri: str) -> tuple[rsa.RSAPrivateKey, dict[str, Any]]:
    """A new key and the account's JSON fields, its token exchanged at ``token_uri``."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    return key, {"type": "service_account", "client_email": CLIENT_EMAIL, "private_key": pem,
                 "token_uri": token_uri}


def write_service_account(path: Path, token_uri: str) -> rsa.RSAPrivateKey:
    """The account written to ``path`` as a service-account file; its key."""
    key, fields = service_account(token_uri)
    path.write_text(json.dumps(fields))
    return key


def jwt_grant(now_s: float | None = None, lifetime_s: int = 3600, **claims: Any) -> dict[str, str]:
    """The form a service account posts to its token_uri: a JWT (its signature not a real
    one, which the simulator cannot check) issued at ``now_s``."""
    issued = int(time.time() if now_s is None else now_s)
    body = {"iss": CLIENT_EMAIL, "aud": "https://oauth2.googleapis.com/token",
            "scope": "https://www.googleapis.com/auth/firebase.messaging",
            "iat": issued, "exp": issued + lifetime_s, **claims}
    parts = [base64.urlsafe_b64encode(json.dumps(part).encode()).rstrip(b"=").decode()
             for part in ({"alg": "RS256", "typ": "JWT"}, body)]
    return {"grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
            "assertion": ".".join([*parts, "c2lnbmF0dXJl"])}
