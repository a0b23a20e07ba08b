"""lcm-proxy: an OpenAI-compatible reverse proxy with lossless context management."""

__version__ = "0.1.0"
