"""Who is calling: a proxy API key names a tenant, and an end user may narrow it further.

With no keys configured the proxy serves one tenant (``default``) and binds to loopback by default.
Keys are compared in constant time, and no error message ever echoes the key that was presented.

Scopes (``proxy.scopes``). Conversations, recall and deletion work within the key's tenant or, when the
request names an end user (OpenAI's ``user`` field, or the ``X-LCM-User`` header, which wins), that user's
scope within it. Two users who open alike get two conversations, and neither's recall or admin view reaches
the other's.

Admin keys (``ApiKey.admin``; LiteLLM's ``general_settings.master_key`` becomes one) may name any tenant
under ``/lcm/`` (``?tenant=``); every other key sees its own tenant only.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from starlette.requests import HTTPConnection, Request

from proxy.config.settings import ApiKey
from proxy.errors import AuthenticationError, InvalidRequestError

DEFAULT_TENANT = "default"
USER_HEADER = "x-lcm-user"


@dataclass(frozen=True)
class Caller:
    tenant: str
    admin: bool  # may name other tenants under /lcm/


def checked_user(value: object, param: str) -> str | None:
    """An end-user id as a client sent it (any string; it is hashed), or None when absent or empty."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequestError(f"Invalid '{param}': expected a string.", param=param, code="invalid_type")
    return value.strip() or None


def request_user(request: Request, body_user: object = None) -> str | None:
    """The end user a request names: the ``X-LCM-User`` header, else the body's ``user`` field. A header with
    no value (empty or blanks, as a gateway filling a template with an unset variable sends it) names nobody,
    as an empty ``user`` does: the body's ``user`` still applies, instead of the request silently landing in
    the tenant's own scope."""
    header = checked_user(request.headers.get(USER_HEADER), USER_HEADER)
    return header if header is not None else checked_user(body_user, "user")


class Authenticator:
    def __init__(self, keys: list[ApiKey]) -> None:
        self._keys = [(k.key.encode(), k.tenant, k.admin) for k in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def caller(self, request: HTTPConnection) -> Caller:
        if not self._keys:
            return Caller(DEFAULT_TENANT, admin=True)  # one tenant, on loopback: its operator
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
        found: Caller | None = None
        for key, tenant, admin in self._keys:  # no early exit: timing does not reveal which key matched
            if hmac.compare_digest(key, presented):
                found = Caller(tenant, admin)
        if found is None:
            raise AuthenticationError("Incorrect API key provided.")
        return found

    def tenant_for(self, request: Request) -> str:
        return self.caller(request).tenant
