"""The OpenAPI schema as the server answers: errors in OpenAI's shape (bad input is 400, never 422)."""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


WHY = {400: "Invalid request: a field's value, a prompt over the context, a field nanocore does not implement",
       401: "Missing or wrong API key", 404: "Unknown model", 413: "Request body over the server's limit",
       429: "Too many waiting requests", 500: "The request failed in the engine",
       503: "Shutting down, or the engine stopped"}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorResponse, "description": WHY[status]} for status in statuses}


def install_schema(app: FastAPI) -> None:
    """``app.openapi()`` without FastAPI's 422 validation responses (the server answers those with 400)."""

    def schema() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for operations in spec.get("paths", {}).values():
                for operation in operations.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                spec.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = schema
