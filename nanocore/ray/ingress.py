"""The HTTP ingress: the server's own FastAPI app (``serve.api.build_app``) over an engine client whose transport
sends each request to an engine replica. Responses name the replica that served them (``x-nanocore-replica``)."""
from __future__ import annotations

from ray import serve

from nanocore.serve.api import ServerState, build_app
from nanocore.serve.engine_client import EngineClient
from nanocore.serve.server import body_limit_bytes, chat_options
from nanocore.ray.transport import SERVED_BY, RayTransport

REPLICA_HEADER = b"x-nanocore-replica"


class ReplicaHeader:
    """ASGI middleware: a response carries the ids of the engine replicas its prompts went to (debugging, tests)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        served: list[str] = []
        token = SERVED_BY.set(served)  # the transport's task for this request copies the context: same list

        async def send_with_replica(message):
            if message["type"] == "http.response.start" and served:
                replicas = ",".join(dict.fromkeys(served)).encode()
                message = {**message, "headers": [*message.get("headers", []), (REPLICA_HEADER, replicas)]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_replica)
        finally:
            SERVED_BY.reset(token)


@serve.ingress()
class OpenAIIngress:
    """A Ray Serve deployment class (``app.py`` applies the options); ``engine`` is the replicas' handle."""

    async def __init__(self, engine, server: dict):
        info, tokenizer = await engine.options(method_name="describe").remote()
        transport = RayTransport(engine, info, tokenizer, server["affinity_tokens"])
        client = EngineClient(transport, server["max_waiting_requests"])
        parser = server.get("tool_call_parser", "auto")
        template = chat_options(server.get("chat_template"), parser)
        state = ServerState(client, server["served_model_name"], server["api_key"], server["drain_timeout_s"],
                            template, parser)
        self.server_app = build_app(state, body_limit_bytes(server["max_body_mib"]))
        self.server_app.add_middleware(ReplicaHeader)

    def __serve_build_asgi_app__(self):
        return self.server_app

    def check_health(self) -> None:
        if not self.server_app.state.serve.client.is_alive:
            raise RuntimeError("the ingress's engine client is closed")
