"""Bearer-key authentication: a proxy API key names a tenant.

With no keys configured the proxy serves one tenant (``default``) and binds to loopback by default.
Keys are compared in constant time, and no error message ever echoes the key that was presented.
"""

from __future__ import annotations

import hmac

from starlette.requests import Request

from proxy.config import ApiKey
from proxy.errors import AuthenticationError

DEFAULT_TENANT = "default"


class Authenticator:
    def __init__(self, keys: list[ApiKey]) -> None:
        self._keys = [(k.key.encode(), k.tenant) for k in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def tenant_for(self, request: Request) -> str:
        if not self._keys:
            return DEFAULT_TENANT
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            # Some clients send the key as x-api-key (Anthropic style); accept it too.
            token = request.headers.get("x-api-key", "")
            if not token:
                raise AuthenticationError(
                    "Missing API key. Send it as 'Authorization: Bearer <key>'.", code="missing_api_key"
                )
        presented = token.strip().encode()
        tenant = None
        for key, name in self._keys:  # no early exit: timing does not reveal which key matched
            if hmac.compare_digest(key, presented):
                tenant = name
        if tenant is None:
            raise AuthenticationError("Incorrect API key provided.")
        return tenant
