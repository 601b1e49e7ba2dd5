"""A request body limit: a body over it gets 413, before it is read (by its Content-Length) or once it passes the
limit while it is read (a chunked body). uvicorn discards the rest of a body nobody reads."""
from __future__ import annotations

import json

from starlette.exceptions import HTTPException

#: JSON parsing holds the GIL (8 MiB of token ids parse in ~0.25 s); a prompt as long as a 128k-token context is
#: about 1 MiB of text or token ids, so the limit leaves room for any prompt a served model can take
DEFAULT_MAX_BODY_MIB = 8.0


class BodyTooLarge(HTTPException):
    """Raised to the route reading a body past the limit; the app's HTTP error handler answers it."""

    def __init__(self, limit: int):
        super().__init__(413, f"the request body is over this server's limit of {limit} bytes (--max-body-mib); "
                              f"send a smaller request")


class BodyLimit:
    """ASGI middleware: an HTTP request whose body is over ``limit`` bytes is answered 413."""

    def __init__(self, app, limit: int):
        if limit < 1:
            raise ValueError(f"the request body limit must be at least 1 byte, got {limit}")
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers", ())).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            return await self._refuse(send)
        received = 0

        async def counted_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, counted_receive, send)

    async def _refuse(self, send) -> None:
        error = BodyTooLarge(self.limit)
        body = json.dumps({"error": {"message": error.detail, "type": "invalid_request_error", "param": None,
                                     "code": "request_too_large"}}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
