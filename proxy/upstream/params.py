"""What goes into a LiteLLM call besides the client's fields: the deployment keys LiteLLM's Router reads but a
call must not get, the chat parameters LiteLLM translates for other providers, the placeholder key that keeps
the proxy's own key private, and the credentials a call carries (to redact from whatever comes back)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.redaction import credential_values

# Keys LiteLLM Router understands in litellm_params but completion() does not.
ROUTER_ONLY_PARAMS = frozenset(
    {"rpm", "tpm", "weight", "order", "max_parallel_requests", "model_name", "use_in_pass_through", "tags"}
)
# OpenAI chat parameters LiteLLM translates for non-OpenAI providers.
TRANSLATED_PARAMS = frozenset(
    {
        "temperature", "top_p", "n", "stop", "max_tokens", "max_completion_tokens", "presence_penalty",
        "frequency_penalty", "logit_bias", "user", "response_format", "seed", "tools", "tool_choice",
        "parallel_tool_calls", "logprobs", "top_logprobs", "reasoning_effort", "metadata", "modalities",
        "audio", "prediction", "web_search_options", "functions", "function_call",
    }
)  # fmt: skip

# Not a credential: the key sent to an api_base configured without one (see ``Upstream._kwargs``).
PLACEHOLDER_KEY = "no-key-configured"


def call_credentials(params: Mapping[str, Any]) -> tuple[str, ...]:
    """Every credential a call could carry: its api_key and the other credential-looking values of its
    parameters (aws_secret_access_key, vertex_credentials, every extra_headers value…). Keys LiteLLM reads
    from the environment are added by ``redact_upstream_message`` itself."""
    own = {k: v for k, v in params.items() if k not in TRANSLATED_PARAMS and k not in ("messages", "extra_body")}
    return tuple(v for v in credential_values(own) if v != PLACEHOLDER_KEY)
