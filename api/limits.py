"""Limits against slow or hostile clients that the web server itself does not enforce.

``genjob api`` runs on Granian, which closes a connection whose request headers are not all in after
``GENJOB_API_HEADER_TIMEOUT_S`` and serves at most ``GENJOB_API_MAX_CONNECTIONS`` connections at once
(more wait in the listen backlog). What Granian does not bound is a request *body* that stalls: this
ASGI middleware gives every read of the body ``GENJOB_API_BODY_TIMEOUT_S`` and answers 408 (closing
the connection) when it runs out. A body sent with a ``Content-Encoding`` (gzip, say) is answered 415
naming the encoding at its first read: the API reads bodies as they are sent, and a compressed one
would otherwise be taken for text in another encoding. Sizes are bounded while streaming
(``genjob.api.uploads``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyReadTimeout(HTTPException):
    def __init__(self, seconds: float) -> None:
        super().__init__(
            408,
            f"the request body sent nothing for {seconds:g} s (GENJOB_API_BODY_TIMEOUT_S)",
            headers={"Connection": "close"},
        )


class EncodedBody(HTTPException):
    def __init__(self, encoding: str) -> None:
        super().__init__(
            415, f"Content-Encoding {encoding[:40]!r} is not accepted: send the body uncompressed"
        )


class BodyTimeoutMiddleware:
    """Each ``receive()`` of an HTTP request body must deliver within ``seconds``; once the body is
    complete, receive is passed through untouched (it then waits for the disconnect, legitimately
    for as long as a response streams)."""

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state: dict[str, Any] = {"complete": False}
        headers = dict(scope.get("headers") or [])
        encoding = headers.get(b"content-encoding", b"").decode("latin-1").strip().lower()

        async def timed_receive() -> Message:
            if state["complete"]:
                return await receive()
            if encoding not in ("", "identity"):
                raise EncodedBody(encoding)
            try:
                async with asyncio.timeout(self.seconds):
                    message = await receive()
            except TimeoutError:
                raise BodyReadTimeout(self.seconds) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                state["complete"] = True
            return message

        await self.app(scope, timed_receive, send)
