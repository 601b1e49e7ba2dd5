"""Data parallel on Ray Serve: N engine replicas behind the same OpenAI routes as ``nanocore serve``.

Optional (``pip install 'nanocore-llm[ray]'``): only this package imports ray, and nothing else in nanocore imports it.
``nanocore serve-ray`` runs it; ``app.build_application`` builds the Ray Serve application.
"""
