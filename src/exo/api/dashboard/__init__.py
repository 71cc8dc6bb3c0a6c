"""The web dashboard: ``GET /`` (the page for browsers, Ollama's heartbeat line for
everything else), its static assets under ``/dashboard/``, and ``GET /events``, the
node's state as server-sent events.

The assets are plain ES modules and CSS shipped in ``static/``: no build step, no CDN.
Every page answer carries a strict Content-Security-Policy (scripts and styles from this
node only, no inline script), a second wall behind the page's own rule of never turning
model output or node-supplied strings into HTML.
"""

from exo.api.dashboard.routes import router

__all__ = ["router"]
