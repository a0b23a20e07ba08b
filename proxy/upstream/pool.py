"""The HTTP client of the calls the proxy sends itself: chat on the direct path (``proxy.upstream.direct``) and
the native Messages and Responses calls (``proxy.upstream.relay.post``).

aiohttp, not httpx: per request it costs a third to a quarter of httpx's CPU (``python -m bench clients``
measures both against the same fake upstream), and the proxy's own cost per request is what a busy machine runs
out of. One session per event loop (a pooled connection belongs to the loop that opened it), keep-alive pools,
the environment's proxy settings (``HTTP_PROXY``, ``HTTPS_PROXY``, ``NO_PROXY``, read per request; never
``~/.netrc``'s credentials), no redirects followed, no cookies kept (an upstream's cookie must not travel from one
tenant's request to another's), and each request's own timeouts.

The rest of the proxy reads httpx: ``mapped`` is the one place where aiohttp's errors become httpx's (a refused
or failed connection ``ConnectError``, a connect timeout ``ConnectTimeout``, a read timeout ``ReadTimeout``, a
request that could not be written ``WriteError``, a cut answer ``RemoteProtocolError``), so the error boundary
(``proxy.upstream.errors``) and the resend of a request that never left read them as they read the OpenAI
SDK's; ``Response`` offers the part of ``httpx.Response`` the readers use (status, headers, the body as chunks
or lines, ``aclose``).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import aiohttp
import httpx
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

CHUNK_BYTES = 1 << 16
LIMIT_PER_HOST = 500  # connections open at once to one upstream host (as LiteLLM's own aiohttp transport)
# True: requests go out through httpx instead (one client per event loop), for unit tests that mock httpx (respx).
HTTPX = False
_sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = weakref.WeakKeyDictionary()


class Answer(Protocol):
    """An open HTTP answer as the proxy's readers use it: an ``httpx.Response`` or this module's ``Response``."""

    status_code: int
    headers: Any  # case-insensitive ``get``

    @property
    def request(self) -> httpx.Request: ...

    def aiter_raw(self, chunk_size: int | None = ...) -> AsyncIterator[bytes]: ...

    def aiter_bytes(self, chunk_size: int | None = ...) -> AsyncIterator[bytes]: ...

    def aiter_lines(self) -> AsyncIterator[str]: ...

    async def aclose(self) -> None: ...


def _request(url: str) -> httpx.Request:
    return httpx.Request("POST", url)  # what an error names: neither the body nor the headers


@contextmanager
def mapped(url: str) -> Iterator[None]:
    """aiohttp's errors as the httpx errors the error boundary reads (naming a POST to ``url``)."""
    try:
        yield
    except aiohttp.ConnectionTimeoutError as exc:
        raise httpx.ConnectTimeout(str(exc) or "connect timed out", request=_request(url)) from exc
    except aiohttp.SocketTimeoutError as exc:
        raise httpx.ReadTimeout(str(exc) or "read timed out", request=_request(url)) from exc
    except aiohttp.ServerTimeoutError as exc:
        raise httpx.ReadTimeout(str(exc) or "timed out", request=_request(url)) from exc
    except aiohttp.ClientConnectorError as exc:
        raise httpx.ConnectError(str(exc), request=_request(url)) from exc
    except aiohttp.ClientConnectionResetError as exc:
        raise httpx.WriteError(str(exc), request=_request(url)) from exc
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
        raise httpx.RemoteProtocolError(str(exc) or type(exc).__name__, request=_request(url)) from exc
    except aiohttp.ClientError as exc:
        raise httpx.NetworkError(str(exc) or type(exc).__name__, request=_request(url)) from exc


class Response:
    """An open answer: what the proxy's readers use of an ``httpx.Response``."""

    def __init__(self, raw: aiohttp.ClientResponse, url: str) -> None:
        self._raw = raw
        self._url = url
        self.status_code = raw.status
        self.headers = raw.headers  # case-insensitive, like httpx's

    @property
    def request(self) -> httpx.Request:
        return _request(self._url)

    async def aiter_raw(self, chunk_size: int | None = None) -> AsyncIterator[bytes]:
        """The body as it arrives (decompressed, as aiohttp reads it), in chunks of at most ``chunk_size`` bytes."""
        with mapped(self._url):
            async for chunk in self._raw.content.iter_chunked(chunk_size or CHUNK_BYTES):
                yield chunk

    aiter_bytes = aiter_raw

    async def aiter_lines(self) -> AsyncIterator[str]:
        """The body's lines, without their ``\\n`` or ``\\r\\n``, however long (an SSE event may be large). Each
        chunk is searched once: a long line costs its length, not its length squared."""
        pending: list[bytes] = []
        async for chunk in self.aiter_raw():
            start = 0
            while (cut := chunk.find(b"\n", start)) >= 0:
                pending.append(chunk[start:cut])
                line, pending = b"".join(pending), []
                yield line.removesuffix(b"\r").decode("utf-8", "replace")
                start = cut + 1
            if start < len(chunk):
                pending.append(chunk[start:])
        if pending:
            yield b"".join(pending).removesuffix(b"\r").decode("utf-8", "replace")

    async def aclose(self) -> None:
        """Done with it: a connection read to its end goes back to the pool; one left mid-answer is closed (a
        local server stops generating when its client goes)."""
        if self._raw.content.at_eof():
            self._raw.release()
        else:
            self._raw.close()


def _session() -> aiohttp.ClientSession:
    loop = asyncio.get_running_loop()
    session = _sessions.get(loop)
    if session is None or session.closed:
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=LIMIT_PER_HOST),
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,  # not ~/.netrc's credentials: the proxy settings are read per request (``_proxy``)
            auto_decompress=True,
        )
        _sessions[loop] = session
    return session


def _proxy(url: str) -> tuple[URL | None, aiohttp.BasicAuth | None]:
    """The proxy the environment names for ``url`` (``HTTP_PROXY``, ``HTTPS_PROXY``, ``NO_PROXY``), as httpx
    and the OpenAI SDK honour them; (None, None) for none."""
    try:
        return get_env_proxy_for_url(URL(url))
    except LookupError:
        return None, None


_httpx_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = weakref.WeakKeyDictionary()


async def send(url: str, content: bytes, headers: dict[str, str], timeout: httpx.Timeout) -> Answer:
    """POST ``content`` to ``url``; the answer open, whatever its status.

    Timeouts as httpx applies them: waiting for a pooled connection and opening one within ``pool`` +
    ``connect``, each read within ``read``; and since aiohttp has no write timeout, the exchange up to the
    answer's headers within the sum of all four (a server that takes the connection but never reads a large
    body must not hold the call forever)."""
    if HTTPX:
        client = _httpx_clients.setdefault(asyncio.get_running_loop(), httpx.AsyncClient(follow_redirects=False))
        request = client.build_request("POST", url, content=content, headers=headers, timeout=timeout)
        return await client.send(request, stream=True)
    waits = (timeout.pool, timeout.connect, timeout.write, timeout.read)
    pool_and_connect = None if timeout.pool is None or timeout.connect is None else timeout.pool + timeout.connect
    limits = aiohttp.ClientTimeout(
        total=None, connect=pool_and_connect, sock_connect=timeout.connect, sock_read=timeout.read
    )
    proxy, proxy_auth = _proxy(url)
    deadline = asyncio.timeout(None if None in waits else sum(w for w in waits if w is not None))
    with mapped(url):
        try:
            async with deadline:
                raw = await _session().post(
                    url, data=content, headers=headers, timeout=limits, allow_redirects=False, proxy=proxy,
                    proxy_auth=proxy_auth,
                )  # fmt: skip
        except TimeoutError as exc:
            if not deadline.expired():
                raise  # one of aiohttp's own timeouts (``mapped``)
            raise httpx.WriteTimeout("the upstream did not answer in time", request=_request(url)) from exc
    return Response(raw, url)


async def close() -> None:
    """Close this event loop's session (at shutdown)."""
    session = _sessions.pop(asyncio.get_running_loop(), None)
    if session is not None:
        await session.close()
