"""A real headless Chromium (Debian's ``chromium-headless-shell``) driven over the DevTools protocol.

The tests load pages as a person would and read what the page shows: the
rendered DOM, through ``Runtime.evaluate``, and a screenshot. The protocol
is spoken over aiohttp's websocket client on a loop of this object's own.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp

BINARY = shutil.which("chromium-headless-shell") or "/usr/lib/chromium/chromium-headless-shell"


class Browser:
    """One browser process and one page; :meth:`close` ends both."""

    def __init__(self, width: int = 1400, height: int = 1000) -> None:
        self._profile = tempfile.mkdtemp(prefix="otel-rl-chromium-")
        self._process = subprocess.Popen(
            [BINARY, "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0", f"--user-data-dir={self._profile}",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,  # its helpers go with it
        )  # fmt: skip
        port = self._port()
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._call(self._connect(port))
        self.send("Page.enable")
        self.send("Runtime.enable")

    def _port(self) -> int:
        marker = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if marker.exists() and marker.read_text().strip():
                return int(marker.read_text().split()[0])
            time.sleep(0.05)
        raise TimeoutError("chromium did not open its debugging port")

    def _call(self, coroutine, timeout_s: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)

    async def _connect(self, port: int) -> None:
        self._session = aiohttp.ClientSession()
        async with self._session.get(f"http://127.0.0.1:{port}/json/list") as response:
            (page,) = [t for t in await response.json() if t["type"] == "page"]
        self._socket = await self._session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        self._loop.create_task(self._receive())

    async def _receive(self) -> None:
        async for message in self._socket:
            data = json.loads(message.data)
            future = self._pending.pop(data.get("id"), None)
            if future is not None and not future.done():
                future.set_result(data)

    async def _send(self, method: str, params: dict) -> dict:
        ident = next(self._ids)
        future = self._loop.create_future()
        self._pending[ident] = future
        await self._socket.send_str(json.dumps({"id": ident, "method": method, "params": params}))
        return await future

    def send(self, method: str, **params: Any) -> dict:
        answer = self._call(self._send(method, params))
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer["result"]

    def goto(self, url: str, timeout_s: float = 60.0) -> None:
        self.send("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'", timeout_s)

    def eval(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 60.0) -> Any:
        """The expression's value once truthy; TimeoutError naming it otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                value = self.eval(expression)
            except RuntimeError:
                value = None  # the page is navigating
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError(f"not true within {timeout_s} s: {expression}")

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self._call(self._socket.close(), 5)
            self._call(self._session.close(), 5)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            os.killpg(self._process.pid, signal.SIGKILL)  # the renderer and GPU helpers too, not only the browser
            self._process.wait(10)
            shutil.rmtree(self._profile, ignore_errors=True)
