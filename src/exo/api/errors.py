"""Errors in the format each API's clients expect, chosen by the request's path.

* OpenAI (``/v1/...``): ``{"error": {"message", "type", "param", "code"}}``
* Anthropic (``/v1/messages...``): ``{"type": "error", "error": {"type", "message"}}``
* Ollama (``/api/...``): ``{"error": "..."}``
* exo management (everything else): ``{"detail": "..."}``
"""

from collections.abc import Sequence
from enum import Enum
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from loguru import logger
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send


class ApiFamily(Enum):
    OPENAI = "openai"
    CLAUDE = "claude"
    OLLAMA = "ollama"
    EXO = "exo"


def family_for_path(path: str) -> ApiFamily:
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return ApiFamily.CLAUDE
    if path == "/v1" or path.startswith("/v1/"):
        return ApiFamily.OPENAI
    if path == "/api" or path.startswith("/api/"):
        return ApiFamily.OLLAMA
    return ApiFamily.EXO


class ApiError(Exception):
    """A request that cannot be served, with the HTTP status that says why."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


def error_body(
    family: ApiFamily,
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    match family:
        case ApiFamily.OPENAI:
            return {
                "error": {
                    "message": message,
                    "type": _openai_type(status),
                    "param": param,
                    "code": code,
                }
            }
        case ApiFamily.CLAUDE:
            return {
                "type": "error",
                "error": {"type": claude_error_type(status), "message": message},
            }
        case ApiFamily.OLLAMA:
            return {"error": message}
        case ApiFamily.EXO:
            return {"detail": message}


def error_response(family: ApiFamily, error: ApiError) -> JSONResponse:
    body = error_body(family, error.status, error.message, param=error.param, code=error.code)
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else {}
    return JSONResponse(body, status_code=error.status, headers={**headers, **error.headers})


async def send_error(scope: Scope, receive: Receive, send: Send, error: ApiError) -> None:
    """Answer a raw ASGI request with an error (for middleware and streaming responses)."""
    await error_response(family_for_path(scope.get("path", "")), error)(scope, receive, send)


# Error types by HTTP status; other statuses: a server error from 500, else a bad request.
_OPENAI_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}
_CLAUDE_TYPES = {**_OPENAI_TYPES, 413: "request_too_large", 503: "overloaded_error"}


def _openai_type(status: int) -> str:
    return _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def claude_error_type(status: int) -> str:
    return _CLAUDE_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


# ---------------------------------------------------------------- validation messages


def validation_error(errors: Sequence[Any]) -> ApiError:
    """A 400 naming the first offending parameter (``messages.0.content``)."""
    if not errors:
        return ApiError(400, "invalid request")
    first = errors[0]
    loc: list[str] = [str(part) for part in first.get("loc", ())]
    kind = str(first.get("type", ""))
    if kind == "json_invalid":
        return ApiError(400, "the request body is not valid JSON", code="invalid_json")
    if loc and loc[0] == "body":
        loc = loc[1:]
    param = ".".join(loc) or None
    message = _without_pydantic_prefix(kind, str(first.get("msg", "invalid value")))
    if param is None:
        if kind == "missing":
            return ApiError(400, "a JSON request body is required")
        if kind in {"model_attributes_type", "dict_type", "model_type"}:
            return ApiError(400, "the request body must be a JSON object")
        return ApiError(400, f"invalid request body: {message}")
    if kind == "missing":
        return ApiError(400, f"{param}: this parameter is required", param=param)
    return ApiError(400, f"{param}: {message}", param=param)


def _without_pydantic_prefix(kind: str, message: str) -> str:
    """A validator's own text: pydantic words a ``ValueError`` raised in a validator as
    "Value error, <text>", which is pydantic's wording, not the client's problem."""
    prefix = "Value error, "
    if kind == "value_error" and message.startswith(prefix):
        return message[len(prefix):]
    return message


# ---------------------------------------------------------------- handlers


def install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(family_for_path(request.url.path), exc)

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(family_for_path(request.url.path), validation_error(exc.errors()))

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404:
            message = f"not found: {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        error = ApiError(exc.status_code, message)
        response = error_response(family_for_path(request.url.path), error)
        if exc.headers:
            response.headers.update(exc.headers)
        return response

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.opt(exception=exc).error(f"unexpected error on {request.method} {request.url.path}")
        error = ApiError(500, f"internal error: {type(exc).__name__}")
        return error_response(family_for_path(request.url.path), error)

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
