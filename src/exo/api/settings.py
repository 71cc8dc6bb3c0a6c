"""The HTTP API's settings."""

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from exo.shared.constants import EXO_DEFAULT_API_PORT, EXO_MAX_CONCURRENT_REQUESTS


class ApiSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # Localhost unless told otherwise: the API has no business on the network by default.
    host: str = "127.0.0.1"
    # 0: any free port.
    port: int = Field(default=EXO_DEFAULT_API_PORT, ge=0, le=65535)
    # When set, every endpoint but /health needs ``Authorization: Bearer KEY`` or
    # ``x-api-key: KEY``. An empty key means none.
    api_key: str | None = None
    # Origins allowed to call the API from a browser. Empty: CORS is off.
    cors_origins: list[str] = []
    # How long a request waits for an instance of its model to become ready.
    placement_timeout_s: float = Field(default=600.0, gt=0)
    # Generations served at once; more wait in a queue of at most max_queued_requests.
    max_concurrent_requests: int = Field(default=EXO_MAX_CONCURRENT_REQUESTS, ge=1)
    max_queued_requests: int = Field(default=256, ge=0)
    # While a streamed request waits (a queue, a model load), an SSE comment this often.
    keep_alive_interval_s: float = Field(default=10.0, gt=0)
    # Where stored Responses live (None: in memory).
    data_dir: Path | None = None
    max_stored_responses: int = Field(default=1000, ge=1)
    # Fetch http(s) image URLs that requests name (off: such a request is a 400), each within
    # this many bytes and seconds.
    image_url_fetch: bool = False
    image_url_max_bytes: int = Field(default=10 * 1024 * 1024, ge=1)
    image_url_timeout_s: float = Field(default=10.0, gt=0)

    @field_validator("api_key")
    @classmethod
    def _empty_key_is_none(cls, value: str | None) -> str | None:
        return value or None
