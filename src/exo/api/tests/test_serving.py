"""What a client hears for a command that was not applied: the status of the master's
refusal (its kind travels in the error chunk), or a 503 when no master took it."""

import pytest

from exo.api.serving import refusal_error
from exo.shared.types.chunks import RefusalKind, error_chunk


@pytest.mark.parametrize(
    ("refusal", "status", "code"),
    [
        ("log_full", 507, "insufficient_storage"),
        ("no_placement", 409, "no_placement"),
        ("unknown_model", 404, "unknown_model"),
        ("no_instance", 404, "no_instance"),
        ("not_serving", 503, "not_serving"),
        (None, 503, None),
    ],
)
def test_refusal_error(refusal: RefusalKind | None, status: int, code: str | None) -> None:
    error = refusal_error(error_chunk("why", refusal=refusal), "cannot place m")
    assert (error.status, error.code) == (status, code)
    assert error.message == "cannot place m: why"
