"""``lcm-proxy serve`` under uvicorn: the proxy's logging in every process, and a "listening on" line that is
true.

Two things ``uvicorn.run`` does not give us. Worker processes are spawned, so nothing of the parent's logging
setup survives in them: ``ProxyUvicornConfig.configure_logging``, which uvicorn calls first thing in each
worker, sets up the proxy's handler (format, content filter, credential masking) before uvicorn or the app
logs a line. And the "listening on" line is logged once the socket is bound (after the bind in the parent
with workers, after the server's startup without), so a port already in use never prints it.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import socket
from typing import Any

import uvicorn
from uvicorn.supervisors import Multiprocess

from proxy import __version__
from proxy.config.logs import config_credentials
from proxy.config.settings import ProxyConfig
from proxy.logs import configure_logging

log = logging.getLogger("lcm_proxy")
# How long a worker process may go without answering its supervisor's ping before it is killed and replaced,
# with every request it had in flight. uvicorn's default (5 s) kills healthy workers of a loaded or briefly
# stalled machine; a worker that is really hung is still replaced, later.
WORKER_HEALTHCHECK_SECONDS = 30
CONFIG_ENV = "LCM_PROXY_CONFIG"  # where worker processes find the config (``proxy.app.app_from_environment``)
BIND_HOST_ENV = "LCM_PROXY_BIND_HOST"  # and the address bound (``proxy.wire.guard``)


class ProxyUvicornConfig(uvicorn.Config):
    """uvicorn's config, carrying the proxy's log level and the credentials to mask into worker processes."""

    def __init__(self, app: Any, *, lcm_log_level: str, lcm_credentials: list[str], **kwargs: Any) -> None:
        # Set before uvicorn's __init__, which calls configure_logging.
        self.lcm_log_level = lcm_log_level
        self.lcm_credentials = lcm_credentials
        super().__init__(app, **kwargs)

    def configure_logging(self) -> None:
        super().configure_logging()
        configure_logging(self.lcm_log_level, self.lcm_credentials)


class _Supervisor(Multiprocess):
    """uvicorn's supervisor, saying at WARNING (not INFO) when it had to replace a worker process: the requests
    that worker had in flight were cut, which an operator at the default log level should see."""

    def keep_subprocess_alive(self) -> None:
        before = [getattr(p, "pid", None) for p in getattr(self, "processes", [])]
        super().keep_subprocess_alive()
        after = [getattr(p, "pid", None) for p in getattr(self, "processes", [])]
        for old, new in zip(before, after, strict=False):
            if old != new:
                log.warning("worker process %s died or stopped answering; replaced by %s", old, new)


def _address(sock: Any) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, config_path: str) -> None:
        super().__init__(config)
        self.config_path = config_path

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)  # exits the process if the port cannot be bound
        if sockets is None and self.started:
            bound = [s for server in self.servers for s in (server.sockets or ())]
            log_listening([_address(s) for s in bound], self.config_path)


def log_listening(addresses: list[str], config_path: str) -> None:
    for address in addresses:
        log.info("lcm-proxy %s listening on http://%s (config %s)", __version__, address, config_path)


def serve(config: ProxyConfig, config_path: str, host: str, port: int, workers: int) -> int:
    """Run the server until it is stopped; 1 if it never started (e.g. the port was taken)."""
    settings = config.general_settings
    common: dict[str, Any] = {
        "host": host,
        "port": port,
        "log_level": settings.log_level,
        "access_log": settings.access_log,
        "timeout_graceful_shutdown": 10,
        # uvicorn's own loggers propagate to the proxy's handler instead of handlers of their own: one format,
        # credentials masked and query strings cut in their lines too.
        "log_config": None,
        "lcm_log_level": settings.log_level,
        "lcm_credentials": config_credentials(config),
    }
    if workers > 1:
        # Workers are separate processes: they build the app from the config file named in the environment.
        os.environ[CONFIG_ENV] = config_path
        os.environ[BIND_HOST_ENV] = host
        if "timeout_worker_healthcheck" in inspect.signature(uvicorn.Config).parameters:
            common["timeout_worker_healthcheck"] = WORKER_HEALTHCHECK_SECONDS
        uv_config = ProxyUvicornConfig("proxy.app:app_from_environment", factory=True, workers=workers, **common)
        sock = uv_config.bind_socket()  # exits the process if the port cannot be bound
        log_listening([_address(sock)], config_path)
        supervisor: Any = _Supervisor
        if "target" in inspect.signature(Multiprocess).parameters:  # uvicorn before 0.36
            server = _Server(uv_config, config_path)
            supervisor(uv_config, target=server.run, sockets=[sock]).run()
        else:
            supervisor(uv_config, sockets=[sock]).run()
        return 0

    from proxy.app import create_app

    server = _Server(ProxyUvicornConfig(create_app(config, serving=True, bind_host=host), **common), config_path)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl+C: uvicorn has shut down cleanly already
        server.run()
    return 0 if server.started else 1
