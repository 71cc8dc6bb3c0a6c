"""The dashboard's static files: found once at import, served by name only."""

from pathlib import Path

STATIC_DIR = Path(__file__).parent / "static"

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}

# Scripts, styles, fetches and images from this node only; nothing inline, no frames.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

SECURITY_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


def asset_names(root: Path = STATIC_DIR) -> dict[str, Path]:
    """Every servable file under ``root`` by its relative name (``js/chat.js``)."""
    return {
        path.relative_to(root).as_posix(): path
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.suffix in CONTENT_TYPES
    }


def content_type(path: Path) -> str:
    return CONTENT_TYPES[path.suffix]


def total_size(root: Path = STATIC_DIR) -> int:
    return sum(path.stat().st_size for path in asset_names(root).values())
