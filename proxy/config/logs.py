"""Logging as a config asks for it: its level, and every credential it holds masked in every line."""

from __future__ import annotations

from proxy.config.settings import ProxyConfig
from proxy.logs import configure_logging
from proxy.redaction import credential_values


def config_credentials(config: ProxyConfig) -> list[str]:
    """Every credential in the config: the deployments' (api_key, extra_headers…) and the proxy's own keys."""
    found = [k.key for k in config.general_settings.api_keys]
    for deployment in config.model_list:
        found += credential_values(deployment.litellm_params.model_dump(exclude_none=True))
    return found


def configure_serving_logs(config: ProxyConfig) -> None:
    """``configure_logging`` at the config's level, masking the config's credentials."""
    configure_logging(config.general_settings.log_level, config_credentials(config))
