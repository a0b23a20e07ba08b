"""Deployments of one model group on fake upstreams: the config entries, the routing they resolve to, and
responders that record which deployment answered."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.config.loading import parse_config
from proxy.upstream.routing import ModelRouter
from tests.support.fakes import Reply
from tests.support.proxies import UPSTREAM_KEY


def deployment(name: str, url: str, model: str, window: int = 100000, **params: Any) -> dict[str, Any]:
    return {
        "model_name": name,
        "litellm_params": {"model": f"openai/{model}", "api_base": f"{url}/v1", "api_key": UPSTREAM_KEY, **params},
        "model_info": {"max_input_tokens": window},
    }


def answering(order: list[str], name: str, reply: Callable[[dict[str, Any]], Reply]) -> Callable[..., Reply]:
    """A responder that notes which deployment (and model) was asked, in the order the calls arrived."""

    def respond(body: dict[str, Any]) -> Reply:
        order.append(f"{name}:{body['model']}")
        return reply(body)

    return respond


def unavailable(body: dict[str, Any]) -> Reply:
    return Reply(status=503, error_message="overloaded", error_type="server_error")


def resolved(models: list[dict[str, Any]], name: str = "m", **general: Any) -> Any:
    config = parse_config({"model_list": models, "general_settings": general})
    return ModelRouter(config.model_list, config.general_settings.fallbacks).resolve(name), config
