"""Scopes: where a request's conversations live. A tenant (named by its API key), or an end user within it.

An app serving many end users through one key names each (OpenAI's ``user`` field, ``X-LCM-User``, or the
CLI's ``--user``); that user's conversations, recall and deletion then live in a scope of their own: the
tenant's name, ``/user-`` and a salted hash of the user id. The store never keeps the raw id, and a scope can
never be mistaken for a tenant (a tenant's name has no ``/``).
"""

from __future__ import annotations

import hashlib


def user_scope(tenant: str, user: str | None) -> str:
    """The scope of ``user`` within ``tenant`` (the tenant itself when there is no user)."""
    if not user:
        return tenant
    digest = hashlib.sha256(b"lcm-proxy user\x00" + tenant.encode() + b"\x00" + user.encode()).hexdigest()
    return f"{tenant}/user-{digest[:24]}"


def end_users_of(tenant: str | None) -> str | None:
    """The prefix every end user's scope within ``tenant`` starts with (None for no tenant, or for a scope that
    is an end user's already): what "everything of a tenant" covers besides the tenant's own scope."""
    if tenant is None or "/" in tenant:
        return None
    return f"{tenant}/user-"


def tenant_for_bare_key(key: str) -> str:
    """``key-`` and 12 hex digits of a salted SHA-256 of the key: stable, and it does not reveal the key."""
    return "key-" + hashlib.sha256(b"lcm-proxy tenant\x00" + key.encode()).hexdigest()[:12]
