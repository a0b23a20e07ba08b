"""Names LiteLLM's proxy config uses, so that a pasted LiteLLM config is read, not refused key by key.

Kept here as data, not read from the ``litellm`` package: ``check-config`` must answer without importing it
(seconds, and possibly the network). ``tests/config/test_config_compat.py`` checks these lists against the installed
LiteLLM, so a release that adds a key is noticed.
"""

from __future__ import annotations


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Top-level sections of a LiteLLM proxy config besides model_list and general_settings.
LITELLM_SECTIONS = _names(
    """
    litellm_settings router_settings environment_variables callback_settings guardrails credential_list
    files_settings assistant_settings finetune_settings mcp_servers mcp_tools vector_store_registry search_tools
    worker_registry policies policy_attachments prompts agent_list sandbox_tools pass_through_endpoints
    """
)

# general_settings keys of LiteLLM's proxy (ConfigGeneralSettings, and what proxy_server reads besides).
LITELLM_GENERAL_SETTINGS = _names(
    """
    admin_only_routes admission_queue_timeout_seconds alert_to_webhook_url alert_type_config alert_types alerting
    alerting_args alerting_threshold allow_cli_sso_verification_uri_complete allow_client_side_credentials
    allow_public_health_readiness_details allow_requests_on_db_unavailable allow_unmanaged_response_ids
    allow_user_auth allowed_file_extensions allowed_ips allowed_routes always_include_stream_usage
    apply_user_budget_to_team_keys auto_redirect_ui_login_to_sso background_health_check_model_groups
    background_health_checks blocked_file_extensions cancel_on_disconnect claude_code_gateway_managed_settings
    completion_model control_plane_url coordination_redis custom_auth custom_auth_run_common_checks
    custom_key_generate custom_key_policy custom_key_update custom_sso custom_team_metadata_validate
    custom_ui_sso_sign_in_handler dangerously_permit_weak_or_unset_master_key database_args
    database_connect_timeout database_connection_pool_limit database_connection_pool_timeout
    database_connection_timeout database_disable_prepared_statements database_extra_connection_params
    database_max_idle_connection_lifetime database_socket_timeout database_type database_url default_team_disabled
    disable_auto_add_proxy_admin_to_teams disable_batch_input_file_rate_limiting
    disable_bedrock_agent_runtime_passthrough disable_budget_reservation disable_custom_api_keys
    disable_env_credential_login disable_error_logs disable_key_generate_for_org_admin disable_master_key_return
    disable_model_info_refresh disable_password_login_when_sso_enabled disable_prisma_schema_update
    disable_reset_budget disable_responses_id_security disable_retry_on_max_parallel_request_limit_error
    disable_spend_logs disable_spend_updates drain_endpoint_token enable_claude_code_gateway enable_drain_endpoint
    enable_health_check_routing enable_jwt_auth enable_mcp_registry enable_oauth2_auth enable_oauth2_proxy_auth
    enable_openai_websocket_passthrough enable_public_model_hub enforce_fallback_model_access enforce_rbac
    enforce_user_param enforced_params expose_fallback_errors_to_caller fail_closed_budget_enforcement
    fail_closed_rate_limit_enforcement failed_login_block_seconds failed_login_window_seconds
    forward_client_headers_to_llm_api forward_llm_provider_auth_headers forward_openai_org_id
    global_max_parallel_requests health_check_concurrency health_check_details
    health_check_ignore_transient_errors health_check_interval health_check_skip_disabled_background_models
    health_check_staleness_threshold hide_default_credentials_hint include_call_id_in_error_body
    infer_model_from_keys key_management_settings key_management_system litellm_jwtauth litellm_key_header_name
    litellm_license master_key max_batch_file_records max_batch_file_size_mb max_batch_file_uploads_per_day
    max_failed_login_attempts_per_source max_failed_login_attempts_per_source_overrides
    max_file_downloads_per_minute max_file_size_mb max_in_flight_requests_per_worker max_parallel_requests
    max_queued_requests_per_worker max_request_size_mb max_response_size_mb
    maximum_autorouter_session_retention_period maximum_daily_tag_spend_retention_period
    maximum_health_check_retention_period maximum_spend_logs_cleanup_batch_size
    maximum_spend_logs_cleanup_batch_timeout maximum_spend_logs_cleanup_cron maximum_spend_logs_cleanup_max_batches
    maximum_spend_logs_cleanup_run_budget maximum_spend_logs_retention_interval maximum_spend_logs_retention_period
    mcp_advertised_versions mcp_allow_all_keys_respects_mcp_scope mcp_allowed_clients mcp_client_id_header
    mcp_client_side_auth_header_name mcp_internal_ip_ranges mcp_prefer_client_id_metadata_document
    mcp_required_fields mcp_session_token_signing mcp_trusted_proxy_ranges mcp_xff_num_trusted_hops
    missing_session_id model_list_healthy_only oauth2_config_mappings otel pass_through_endpoints
    pass_through_request_timeout passthrough_managed_object_ids password_policy_check_breached_passwords
    password_policy_min_length password_policy_require_lowercase password_policy_require_numbers
    password_policy_require_special_characters password_policy_require_uppercase plugins
    provider_url_destination_allowed_hosts proxy_batch_write_at proxy_budget_rescheduler_max_time
    proxy_budget_rescheduler_min_time proxy_config_reload_interval_seconds public_routes
    reject_clientside_metadata_tags require_end_user_mcp_access_defined require_key_mcp_access_defined
    responses_websocket_session_limit_seconds role_permissions scheduled_job_stagger search_tool_deny_by_default
    search_tools service_account_settings skip_batch_input_file_rate_limiting_for_models
    skip_batch_input_file_rate_limiting_for_providers spend_capture_rate_check spend_logs_metadata_fields
    spend_report_frequency store_model_in_db store_prompts_in_spend_logs supported_db_objects team_metadata_schema
    team_metadata_validation_error_message team_metadata_validation_timeout token_rate_limit_type tracing
    track_unmanaged_batch_cost transcribe_media_buckets trusted_proxy_ranges ui_access_mode use_azure_key_vault
    use_google_kms use_redis_transaction_buffer use_shared_health_check use_spend_logs_partitioning
    use_team_public_model_name use_x_forwarded_for user_api_key_cache_max_size user_api_key_cache_ttl
    user_header_mappings user_header_name user_mcp_management_mode user_url_allowed_hosts user_url_validation
    vector_store_deny_by_default
    """
)

# Keys whose misspelling changes what the proxy does without a word: a near miss of one of them (``api_bse``,
# ``max_input_token``) is worth a warning. Other unknown keys are LiteLLM's business and pass silently.
MODEL_INFO_KEYS = _names(
    "max_input_tokens max_output_tokens max_tokens supports_function_calling token_margin base_model mode id"
)
LITELLM_PARAMS_KEYS = _names(
    """
    model api_key api_base base_url api_version timeout stream_timeout max_retries num_retries organization
    custom_llm_provider aws_region_name aws_access_key_id aws_secret_access_key aws_session_token aws_profile_name
    vertex_project vertex_location vertex_credentials region_name drop_params extra_headers headers extra_body
    temperature top_p max_tokens seed reasoning_effort
    """
)
# Real LiteLLM keys that happen to be near one of the above (``s3_region_name`` / ``aws_region_name``).
NOT_A_TYPO = _names(
    """
    s3_access_key_id s3_region_name s3_secret_access_key watsonx_region_name aws_role_name aws_session_name
    supports_parallel_function_calling
    """
)

# LiteLLM settings that mean what one of lcm-proxy's ``general_settings`` means: (section, key) -> ours. For one
# of ours, the first listed that the config sets is used (the router's own before the module's, as in LiteLLM);
# ``general_settings`` itself wins over all of them.
MAPPED_SETTINGS: dict[tuple[str, str], str] = {
    ("router_settings", "routing_strategy"): "routing_strategy",
    ("router_settings", "fallbacks"): "fallbacks",
    ("litellm_settings", "fallbacks"): "fallbacks",
    ("router_settings", "model_group_alias"): "model_group_alias",
    ("router_settings", "num_retries"): "upstream_retries",
    ("litellm_settings", "num_retries"): "upstream_retries",
    ("router_settings", "timeout"): "request_timeout",
    ("litellm_settings", "request_timeout"): "request_timeout",
    ("router_settings", "allowed_fails"): "allowed_fails",
    ("litellm_settings", "allowed_fails"): "allowed_fails",
    ("router_settings", "cooldown_time"): "cooldown_time",
    ("litellm_settings", "drop_params"): "drop_params",
}
# LiteLLM's routing strategies (``router_settings.routing_strategy``) and those lcm-proxy implements; the
# others are read as simple-shuffle, with a warning. A name in neither list is a typo: an error.
LITELLM_ROUTING_STRATEGIES = _names(
    """
    simple-shuffle least-busy usage-based-routing usage-based-routing-v2 latency-based-routing cost-based-routing
    provider-budget-routing lar1
    """
)
ROUTING_STRATEGIES = ("simple-shuffle", "least-busy")
