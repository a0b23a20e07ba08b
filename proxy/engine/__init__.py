"""The context engine: identity, interception, compaction, assembly. Imports neither Starlette nor LiteLLM."""
