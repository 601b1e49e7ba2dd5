"""``nanocore serve``: an OpenAI-compatible HTTP server over one engine client.

``protocol`` / ``request_fields`` (request bodies, what is refused) -> ``api`` / ``routes`` (the app) ->
``prompts`` (token ids, off the event loop) -> ``engine_client`` (admission, submit, abort, per-request queues)
-> a transport: ``engine_loop`` (the thread that steps ``LLMEngine``) or ``engine_process`` (that loop in a child
process) -> ``responses`` (OpenAI-shaped bodies and stream chunks); ``metrics`` for Prometheus.
"""
