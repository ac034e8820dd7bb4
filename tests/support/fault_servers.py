"""Real misbehaving HTTP peers on loopback for the live-metrics fault tests."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ports import refused_port


class ScriptedIngest:
    """An ingest endpoint whose answers follow a script.

    ``answers`` is consumed one per request: an int status, or a tuple
    ``(status, headers)``; once exhausted every request gets ``then``.
    ``delay_s`` delays every answer. ``down_until`` (a ``time.monotonic()``
    value) answers 503 to everything before it. ``refuse(record)`` marks
    records the service finds invalid: a batch holding one is answered 400,
    naming the first such record as ``$.records[N]`` unless ``name_field`` is
    False. Decoded batches of 2xx answers are kept.
    """

    def __init__(self, answers=(), then=200, delay_s: float = 0.0, down_until: float = 0.0, refuse=None, name_field=True) -> None:
        self.answers = list(answers)
        self.then = then
        self.delay_s = delay_s
        self.down_until = down_until
        self.refuse = refuse
        self.name_field = name_field
        self.requests: list[dict] = []
        self.accepted: list[dict] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.loads(gzip.decompress(raw)) if self.headers.get("Content-Encoding") == "gzip" else None
                with outer.lock:
                    answer = outer.answers.pop(0) if outer.answers else outer.then
                    outer.requests.append({"headers": dict(self.headers), "path": self.path, "body": body})
                status, headers = answer if isinstance(answer, tuple) else (answer, {})
                error: dict = {"status": status}
                if time.monotonic() < outer.down_until:
                    status, headers = 503, {}
                elif outer.refuse is not None and body is not None:
                    bad = [i for i, r in enumerate(body["records"]) if outer.refuse(r)]
                    if bad:
                        status, headers = 400, {}
                        error = {"error": "refused"}
                        if outer.name_field:
                            error["field"] = f"$.records[{bad[0]}].values"
                if outer.delay_s:
                    time.sleep(outer.delay_s)
                if 200 <= status < 300 and body is not None:
                    with outer.lock:
                        outer.accepted.extend(body["records"])
                    error = {"accepted": len(body["records"]), "duplicates": 0}  # the service's answer
                payload = json.dumps(error).encode()
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def kinds(self) -> list[str]:
        with self.lock:
            return [r["kind"] for r in self.accepted]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class HtmlPage:
    """Answers every request 200 with an HTML page (a proxy's login page, a wrong URL)."""

    def __init__(self) -> None:
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.requests += 1
                page = b"<html><body><form>Sign in to continue</form></body></html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def do_GET(self):
                outer.requests += 1
                page = outer.page
                self.send_response(200)
                self.send_header("Content-Type", outer.content_type)
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            do_PUT = do_POST

            def log_message(self, *args):
                pass

        self.page = b"<html><body><form>Sign in to continue</form></body></html>"
        self.content_type = "text/html; charset=utf-8"
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class SilentServer:
    """Accepts connections and never answers; ``port`` with ``SO_REUSEPORT``: on a port a test holds (:func:`ports.held_port`)."""

    def __init__(self, port: int = 0) -> None:
        self._sock = socket.socket()
        if port:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        self._sock.bind(("127.0.0.1", port))
        self._sock.listen(64)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._held: list[socket.socket] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            if self._stop:
                conn.close()
                return
            self._held.append(conn)

    def stop(self) -> None:
        self._stop = True
        try:  # wakes the thread in accept(): a socket closed under it would go on listening
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        for conn in self._held:
            conn.close()


class TrickleServer:
    """Answers every request one byte at a time, a byte every ``every_s`` seconds: it never finishes an answer in time."""

    def __init__(self, every_s: float = 0.5) -> None:
        self.every_s = every_s
        self.requests = 0
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.requests += 1
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        with conn:
            for byte in answer:
                if self._stop.wait(self.every_s):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    def stop(self) -> None:
        self._stop.set()
        try:  # wakes the thread in accept(): a socket closed under it would go on listening
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


def refused_url() -> str:
    """A loopback URL where nothing listens."""
    return f"http://127.0.0.1:{refused_port()}"
