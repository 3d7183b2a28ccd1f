"""HEAD on every GET route (RFC 9110: a server that answers GET answers HEAD with the same head).

FastAPI's routes answer only the methods they declare, so HEAD was a 405 on every API route,
/health included. This ASGI middleware runs a HEAD as the GET it stands for and sends only the
response's start (status and headers, Content-Length included) and an empty body. A streamed
response (the event stream never ends by itself) is stopped after its head: sending anything
after the end raises `HeadSent`, which ends the app's part of the request here.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HeadSent(Exception):
    """The head went out; the GET's body is not wanted."""


class HeadAsGet:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        finished = False

        async def send_head_only(message: Message) -> None:
            nonlocal finished
            if finished:
                raise HeadSent
            if message["type"] == "http.response.start":
                await send(message)
            elif message["type"] == "http.response.body":
                finished = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                if message.get("more_body", False):
                    raise HeadSent

        try:
            await self.app({**scope, "method": "GET"}, receive, send_head_only)
        except HeadSent:
            pass
