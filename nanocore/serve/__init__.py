"""``nanocore serve``: an OpenAI-compatible HTTP server over an engine loop thread.

``protocol`` (request bodies and errors) -> ``api`` (routes) -> ``async_engine`` (the loop that steps
``LLMEngine``) -> ``responses`` (OpenAI-shaped bodies and stream chunks); ``metrics`` for Prometheus.
"""
