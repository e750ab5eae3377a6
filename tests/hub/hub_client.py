"""A client of a real JupyterHub and of its users' kernels, speaking what a browser speaks:
the Hub's REST API with a token, and the Jupyter kernel protocol over the server's websocket,
both through the Hub's proxy. A module of its own, imported by name (`from hub_client ...`).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

WAIT_S = 120.0  # liveness bound of every wait on the Hub or a kernel; never a measure of speed


def api(url: str, token: str, method: str = "GET", body: Any = None) -> Any:
    """One REST call with a token; the decoded JSON answer (None for an empty one)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": f"token {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
    except urllib.error.HTTPError as error:
        raise AssertionError(f"{method} {url}: {error.code} {error.read()[:500]!r}") from None
    return json.loads(raw) if raw else None


@dataclass
class Execution:
    """What one execute_request brought back: its outputs as text, and its reply."""

    text: list[str] = field(default_factory=list)
    reply: dict[str, Any] = field(default_factory=dict)

    @property
    def output(self) -> str:
        return "".join(self.text)


class KernelSocket:
    """One kernel's channels over the server's websocket (JSON frames, channel in each)."""

    def __init__(self, connection: WebSocketClientConnection) -> None:
        self.connection = connection
        self.session = uuid.uuid4().hex
        self.widgets: dict[str, dict[str, Any]] = {}  # comm id -> the model's state

    @classmethod
    async def open(cls, base: str, token: str, kernel_id: str) -> KernelSocket:
        url = base.replace("http://", "ws://") + f"/api/kernels/{kernel_id}/channels"
        connection = await websocket_connect(HTTPRequest(
            url, headers={"Authorization": f"token {token}"}, request_timeout=WAIT_S))
        return cls(connection)

    def close(self) -> None:
        self.connection.close()

    async def send(self, msg_type: str, content: dict[str, Any], channel: str = "shell") -> str:
        msg_id = uuid.uuid4().hex
        await self.connection.write_message(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": msg_type, "session": self.session,
                       "username": "hub-test", "version": "5.3",
                       "date": datetime.datetime.now(datetime.timezone.utc).isoformat()},
            "parent_header": {}, "metadata": {}, "content": content, "channel": channel,
            "buffers": []}))
        return msg_id

    async def comm_msg(self, comm_id: str, data: dict[str, Any]) -> None:
        """What a widget's view sends when it renders or is clicked."""
        await self.send("comm_msg", {"comm_id": comm_id, "data": data})

    async def execute(self, code: str,
                      on_widget: Callable[[str, dict[str, Any]], Any] | None = None
                      ) -> Execution:
        """Run `code` (allow_stdin, as a notebook page runs a cell) and collect its outputs
        until the kernel is idle again; `on_widget(comm_id, state)` is awaited for each
        widget model the cell opens."""
        msg_id = await self.send("execute_request", {
            "code": code, "silent": False, "store_history": True, "user_expressions": {},
            "allow_stdin": True, "stop_on_error": True})
        return await asyncio.wait_for(self._collect(msg_id, on_widget), WAIT_S)

    async def _collect(self, msg_id: str,
                       on_widget: Callable[[str, dict[str, Any]], Any] | None) -> Execution:
        done, idle = Execution(), False
        while not (idle and done.reply):
            raw = await self.connection.read_message()
            if raw is None:
                raise AssertionError("the kernel's websocket closed")
            if not isinstance(raw, str):
                continue  # a binary frame: buffers, which no message here carries
            message = json.loads(raw)
            kind = message["header"]["msg_type"]
            if kind == "comm_open":
                content = message["content"]
                state = content.get("data", {}).get("state", {})
                self.widgets[content["comm_id"]] = state
                if on_widget is not None:
                    await on_widget(content["comm_id"], state)
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if kind == "execute_reply":
                done.reply = message["content"]
            elif kind == "status":
                idle = message["content"]["execution_state"] == "idle"
            elif kind == "stream":
                done.text.append(message["content"]["text"])
            elif kind in ("execute_result", "display_data"):
                done.text.append(message["content"]["data"].get("text/plain", "") + "\n")
            elif kind == "error":
                done.text.append("\n".join(message["content"]["traceback"]) + "\n")
        return done
