"""The HTTP face of the proxy: OpenAI request, response, SSE and error shapes, and authentication."""
