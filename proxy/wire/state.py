"""What every door shares while the app runs: the config, the router, the store, the engine, the upstream, and
the per-model rules (``proxy.relay.policy``)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from proxy.config.settings import ProxyConfig
from proxy.engine.admin import AdminViews
from proxy.engine.deletion import Retention
from proxy.engine.engine import ContextEngine
from proxy.engine.recall import RecallTools
from proxy.relay.policy import ModelPolicy
from proxy.relay.priority import Priority
from proxy.store.base import Blobs, Store
from proxy.upstream.client import Upstream
from proxy.upstream.routing import ModelRouter
from proxy.wire.auth import Authenticator
from proxy.wire.ratelimit import TokenBuckets


@dataclass
class AppState:
    config: ProxyConfig
    router: ModelRouter
    auth: Authenticator
    started_at: int = field(default_factory=lambda: int(time.time()))
    upstream: Upstream = field(init=False)
    store: Store = field(init=False)
    files: Blobs = field(init=False)
    engine: ContextEngine = field(init=False)
    recall: RecallTools = field(init=False)
    admin: AdminViews = field(init=False)
    policy: ModelPolicy = field(init=False)  # each model's window, margin, tool calling, budget and summariser
    priority: Priority = field(init=False)  # chat requests before background summaries on local servers
    retention: Retention | None = None  # lcm_settings.retention_days: the background purge of idle conversations
    collecting: asyncio.Task[list[str]] | None = None  # startup: leftover payload files of killed processes
    delete_limits: TokenBuckets = field(init=False)  # DELETE /lcm/conversations/{id}, per key
