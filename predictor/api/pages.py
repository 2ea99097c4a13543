"""The playground page (GET / and /playground) and its script and style, served from package data.

Only mounted with PLAYGROUND=true (see server.add_routes): a production predictor serves no UI on its
inference port, so there `/` stays KServe's 404. The page is static: no build step, nothing fetched
from a CDN, and a Content-Security-Policy that forbids any origin but ours.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

# The page's files, by the name the page links them with.
FILES = {
    "index.html": "text/html; charset=utf-8",
    "playground.js": "text/javascript; charset=utf-8",
    "playground.css": "text/css; charset=utf-8",
}
# 'self' only: a copy of the page that tried a CDN would fail loudly in the browser tests. blob: is the
# download link's (and an <audio> fallback's) source; inline styles stay off.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "media-src 'self' blob:; img-src 'self' data: blob:; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'"
)


def _read(name: str) -> bytes:
    return (resources.files("predictor.api") / "playground" / name).read_bytes()


def _handler(serve: Callable[[str], Response], name: str) -> Callable[[], Awaitable[Response]]:
    async def handler() -> Response:
        return serve(name)

    return handler


def router() -> APIRouter:
    # Read once at start: a few kilobytes, and a wheel missing them fails at start, not on a click.
    bodies = {name: _read(name) for name in FILES}
    routes = APIRouter()

    def serve(name: str) -> Response:
        return Response(
            bodies[name],
            media_type=FILES[name],
            # The page changes with the package: a cached copy from an older predictor would call
            # routes as they were.
            headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"},
        )

    @routes.get("/", include_in_schema=False)
    @routes.get("/playground", include_in_schema=False)
    async def page() -> Response:
        return serve("index.html")

    # One route per file, no path parameter: any other name is the router's own 404.
    for name in FILES:
        if name != "index.html":
            routes.add_api_route(
                f"/playground/{name}", _handler(serve, name), methods=["GET"], include_in_schema=False
            )

    return routes
