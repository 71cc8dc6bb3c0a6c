"""The node's HTTP API: OpenAI, Anthropic and Ollama formats, and exo's own endpoints.

``create_app(handle, settings)`` builds the application; the node serves it with
uvicorn. Everything the API does to the cluster goes through the ``NodeHandle``.
"""

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from exo.api import (
    claude,
    dashboard,
    embeddings,
    management,
    ollama,
    ollama_pull,
    openai_chat,
    openai_completions,
    openai_responses,
)
from exo.api.errors import install_error_handlers
from exo.api.generation_service import GenerationService
from exo.api.handle import NodeHandle
from exo.api.image_fetch import ImageFetcher
from exo.api.middleware import ApiKeyMiddleware, BodySizeLimitMiddleware, MetricsMiddleware
from exo.api.request_guard import RequestGuard
from exo.api.settings import ApiSettings
from exo.api.streaming import COMMAND_ID_HEADER
from exo.api.unicode_guard import UnicodeGuard
from exo.shared.models.registry import ModelRegistry

__all__ = ["ApiSettings", "create_app"]


def create_app(
    handle: NodeHandle, settings: ApiSettings, registry: ModelRegistry | None = None
) -> FastAPI:
    """``registry``: the node's model registry (default: one of ``handle``'s models)."""
    service = GenerationService(handle, settings, registry or ModelRegistry(handle.model_cards()))
    app = FastAPI(
        title="exo",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    install_error_handlers(app)
    for module in (
        openai_chat,
        openai_completions,
        openai_responses,
        embeddings,
        claude,
        ollama,
        ollama_pull,
        management,
        dashboard,
    ):
        app.include_router(module.router(service))
    # Added last is outermost: metrics see every answer, CORS answers preflights before
    # the key check (browsers send no credentials there).
    if settings.image_url_fetch:
        app.add_middleware(
            ImageFetcher,
            max_bytes=settings.image_url_max_bytes,
            timeout_s=settings.image_url_timeout_s,
        )
    app.add_middleware(UnicodeGuard)
    if settings.api_key is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=[COMMAND_ID_HEADER],
        )
    app.add_middleware(BodySizeLimitMiddleware)
    # Outside CORS: a foreign Host or Origin is refused before anything else answers.
    app.add_middleware(RequestGuard, api_host=settings.host, cors_origins=settings.cors_origins)
    app.add_middleware(MetricsMiddleware)
    return app
