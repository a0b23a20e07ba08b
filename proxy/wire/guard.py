"""What a web page in the user's browser can make the proxy do: nothing, unless the operator says so.

A proxy on loopback with no keys trusts whoever reaches the port, and a browser reaches it on behalf of any page
it shows. Three checks, before any route runs (``RequestGuard``), each answered in OpenAI's error shape:

* **Host** (DNS rebinding). A page at ``http://evil.test`` whose name is made to resolve to 127.0.0.1 reads the
  proxy as its own origin, but its requests say ``Host: evil.test``. A request that reached the proxy on a
  loopback address must name a loopback host (``localhost`` and ``*.localhost``, 127.0.0.0/8, ``::1``, any
  port). Bound to a non-loopback address (``--host 0.0.0.0``, the Docker image), a proxy with keys serves any
  host (a rebound page does not know the key); one without keys serves only the names no page can rebind to
  it: IP addresses (a page's own name is never one), the loopback names and this machine's own name
  (``socket.gethostname()``), whatever address the request reached (in a container, its own address).
  ``general_settings.allowed_hosts`` replaces that default: the loopback names plus the names listed (a
  leading dot takes a domain and its subdomains), or ``"*"`` for any. Refused: 403 ``host_not_allowed``.
* **Cross-site requests** (CSRF). A page may send a "simple" request (GET, or a POST of ``text/plain``, a
  form, multipart) to any origin without asking first; the browser marks it with ``Origin`` (every POST) and
  ``Sec-Fetch-Site``. A request whose ``Origin`` is not the proxy's own (scheme's default port, host and port
  of its ``Host``) and not listed in ``general_settings.cors_allow_origins``, or that has no ``Origin`` but
  whose ``Sec-Fetch-Site`` says another site or origin sent it (an ``<img>``, a ``<script>``, a link), is
  refused: 403 ``cross_origin_request``. OPTIONS is left to CORS (``proxy.wire.cors``): it runs nothing.
  Tools and SDKs send neither header and are not concerned.
* **Content type** (the bodies a page can send without asking). On JSON endpoints a body must be
  ``application/json`` (any parameters, and ``application/*+json``); the multipart uploads
  (``MULTIPART_PATHS``) take ``multipart/form-data`` too. Anything else, ``text/plain``, a form, is a 415 that
  names it. A request without a ``Content-Type`` is read as JSON, as it always was (scripts posting JSON
  without the header keep working); a page that sends one is stopped by its ``Origin`` instead.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.errors import PermissionDeniedError, ProxyError, UnsupportedMediaTypeError
from proxy.wire.http import error_response

BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Where OpenAI's API takes multipart/form-data (proxy.wire.passthrough.uploads), with and without /v1.
MULTIPART_PATHS = frozenset(
    prefix + path
    for prefix in ("", "/v1")
    for path in ("/audio/transcriptions", "/audio/translations", "/images/edits")
)
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
OTHER_SENDERS = frozenset({"cross-site", "same-site"})  # Sec-Fetch-Site: another origin sent it


def split_host(value: str) -> tuple[str, int | None] | None:
    """``Host`` (or an origin's netloc) as (name in lower case, port or None); None when malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
    else:
        name, colon, port_text_or_empty = value.partition(":")
        port_text = port_text_or_empty if colon else None
    if port_text is not None and not (port_text.isdigit() and len(port_text) <= 5):
        return None
    name = name.rstrip(".")
    if not name or any(c in name for c in "/@?#\\ "):
        return None
    return name, int(port_text) if port_text is not None else None


def is_address(name: str) -> bool:
    """An IP address (v6 without its brackets): what a page's own name, the one it is rebound under, never is."""
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def is_loopback(name: str) -> bool:
    """``localhost`` (and its subdomains, which browsers resolve to loopback themselves), 127.0.0.0/8, ::1."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Hosts:
    """The ``Host`` names served: loopback names always; the others listed, or any."""

    any_host: bool
    names: frozenset[str] = frozenset()
    domains: tuple[str, ...] = ()  # ".example.com": example.com and every name under it

    @classmethod
    def of(cls, allowed: Iterable[str]) -> Hosts:
        entries = [entry.strip().lower().rstrip(".") for entry in allowed]
        return cls(
            any_host="*" in entries,
            names=frozenset(e.strip("[]") for e in entries if not e.startswith(".")),
            domains=tuple(e for e in entries if e.startswith(".")),
        )

    def allows(self, name: str) -> bool:
        if self.any_host or is_loopback(name) or name in self.names:
            return True
        return any(name == domain[1:] or name.endswith(domain) for domain in self.domains)


class RequestGuard:
    """ASGI middleware: the three checks of this module, in order (host, origin, content type)."""

    def __init__(
        self,
        app: ASGIApp,
        allowed_hosts: list[str] | None,
        cors_allow_origins: list[str],
        bind_host: str | None,
        keys: bool = False,
    ) -> None:
        self.app = app
        # Unset: the loopback default; bound to a non-loopback address, any host with keys, the names no page
        # can rebind without them.
        self.hosts = Hosts.of(allowed_hosts) if allowed_hosts is not None else None
        self.open_bind = bind_host is not None and not is_loopback(bind_host.strip("[]").lower())
        self.keys = keys
        own = socket.gethostname().strip().lower().rstrip(".")
        self.own_names = frozenset({own} if own and not is_address(own) else ())
        self.origins = frozenset(cors_allow_origins)
        self.any_origin = "*" in self.origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:
                await error_response(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> ProxyError | None:
        headers = Headers(scope=scope)
        host_header = headers.get("host")
        host = split_host(host_header) if host_header is not None else None
        if host_header is not None and not self.host_allowed(scope, host):
            # Bound beyond loopback without keys and without a list, keys would serve any name too.
            keyless_open = self.open_bind and not self.keys and self.hosts is None
            keys = ", or set general_settings.api_keys" if keyless_open else ""
            return PermissionDeniedError(
                f"The Host {host_header[:100]!r} is not one this proxy serves. A browser page on another site"
                " can reach a server on this machine under a name of its own (DNS rebinding); list the name in"
                f" general_settings.allowed_hosts if it is yours{keys}.",
                code="host_not_allowed",
            )
        if scope["method"] != "OPTIONS":
            refused = self.cross_origin(headers, host)
            if refused is not None:
                return refused
        if scope["method"] in BODY_METHODS:
            return self.wrong_content_type(headers, scope["path"])
        return None

    def host_allowed(self, scope: Scope, host: tuple[str, int | None] | None) -> bool:
        if host is None:
            return False  # a Host header that names no host
        if self.hosts is not None:
            return self.hosts.allows(host[0])
        if self.open_bind:
            # Keys stop a rebound page (it does not know them). Without, the names it cannot rebind: on every
            # server address, since in a container the request reaches the container's own.
            return self.keys or is_address(host[0]) or is_loopback(host[0]) or host[0] in self.own_names
        # The loopback default, where it can matter: requests that reached the proxy on a loopback address
        # (all of them when it is bound to one). An in-process client has no such address.
        server = scope.get("server")
        local = str(server[0]) if server else ""
        return not is_loopback(local) or is_loopback(host[0])

    def cross_origin(self, headers: Headers, host: tuple[str, int | None] | None) -> ProxyError | None:
        origin = headers.get("origin")
        if origin is None:
            sender = headers.get("sec-fetch-site", "").strip().lower()
            if sender not in OTHER_SENDERS:
                return None  # same-origin, typed by the user (none), or not a browser
            why = f"Sec-Fetch-Site says {sender!r} and no Origin was sent"
        else:
            origin = origin.strip().lower()
            if self.any_origin or origin in self.origins or _same_origin(origin, host):
                return None
            why = f"Origin {origin[:100]!r} is another origin"
        return PermissionDeniedError(
            f"Cross-origin request refused: {why}. Pages may call the proxy only from origins listed in"
            " general_settings.cors_allow_origins.",
            code="cross_origin_request",
        )

    @staticmethod
    def wrong_content_type(headers: Headers, path: str) -> ProxyError | None:
        value = headers.get("content-type", "").strip()
        if not value:
            return None
        media = value.split(";", 1)[0].strip().lower()
        if media == "application/json" or (media.startswith("application/") and media.endswith("+json")):
            return None
        multipart = path in MULTIPART_PATHS
        if multipart and media == "multipart/form-data":
            return None
        expected = "multipart/form-data" if multipart else "application/json"
        return UnsupportedMediaTypeError(
            f"Content type {media[:100]!r} is not supported on {path[:200]}: send the body as {expected}."
        )


def _same_origin(origin: str, host: tuple[str, int | None] | None) -> bool:
    """Whether ``origin`` names the host and port the request was sent to (its ``Host``). The scheme is not
    compared: behind a TLS terminator the proxy itself sees http for an https origin; the port tells them apart
    (a ``Host`` without one has the origin's scheme's default)."""
    if host is None:
        return False
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False  # "http://[" and the like: no origin we know, so another one
    netloc = split_host(parts.netloc) if parts.scheme in DEFAULT_PORTS else None
    if netloc is None:
        return False  # "null" (a sandboxed frame, a file: page) or no origin we know
    default = DEFAULT_PORTS[parts.scheme]
    return netloc[0] == host[0].strip("[]") and (netloc[1] or default) == (host[1] or default)


class CloseUnreadBodies:
    """ASGI middleware, outermost: an answer sent before its request's body was received in full closes the
    connection (``connection: close``). The guard's refusals, a 401, a 404 or 405, a 413 answer without
    reading the body; uvicorn then discards the rest of it, but each byte that arrives resets its keep-alive
    timer, so a client trickling a body would hold the connection for ever (``body_read_timeout`` only bounds
    the reads a handler makes)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        length = headers.get("content-length", "").strip()
        if "transfer-encoding" not in headers and length in ("", "0"):
            await self.app(scope, receive, send)  # no body announced: nothing left unread
            return
        received = False

        async def tracked() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                received = True
            return message

        async def closing(message: Message) -> None:
            if message["type"] == "http.response.start" and not received:
                message.setdefault("headers", [])
                MutableHeaders(scope=message)["connection"] = "close"
            await send(message)

        await self.app(scope, tracked, closing)
