"""`Connection: close` on every HTTP answer once the server drains.

uvicorn closes a connection right after an answer that says `Connection: close`, so a client
that gets one is never left holding a keep-alive connection the server may close under its next
request: it opens a new one (to this server's still-open port during the drain, or to another
replica once the endpoints have moved on). Infer 503s of a draining server already say it
(`responses.error_response`); this covers every other answer: results of requests queued before
the signal, health, metadata, metrics.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

_CONNECTION = b"connection"
_CLOSE = (_CONNECTION, b"close")


class CloseWhenDraining:
    """ASGI wrapper: after `start()`, every `http.response.start` that does not name a
    `Connection` header gets `Connection: close`. Other scopes (lifespan) pass straight through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.draining = False

    def start(self) -> None:
        self.draining = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        # Decided when the answer starts, not when the request arrived: a request queued before
        # the signal and answered during the drain closes its connection too.
        async def send_closing(message: Message) -> None:
            if self.draining and message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                if not any(name.lower() == _CONNECTION for name, _ in headers):
                    headers.append(_CLOSE)
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_closing)
