"""A TCP load balancer for tests: each new connection goes to the next backend that accepts it (round robin).

What stands in front of several ``otel-rl serve`` processes in a team's
deployment (nginx, HAProxy, a cloud load balancer), reduced to the one
behaviour the tests need: consecutive connections land on different
servers, and a server that is down is skipped.
"""

from __future__ import annotations

import asyncio
import itertools
import threading

from ports import free_port


class RoundRobin:
    def __init__(self, backends: list[int]) -> None:
        self.backends = backends
        self._next = itertools.cycle(range(len(backends)))
        self.connections = [0] * len(backends)
        self._loop = asyncio.new_event_loop()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> RoundRobin:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._serve, "127.0.0.1", self.port), self._loop).result(10)
        return self

    async def _serve(self, client_reader, client_writer) -> None:
        for _ in range(len(self.backends)):
            index = next(self._next)
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.backends[index])
            except OSError:
                continue  # down: the next one
            self.connections[index] += 1
            await asyncio.gather(self._pipe(client_reader, writer), self._pipe(reader, client_writer))
            return
        client_writer.close()

    @staticmethod
    async def _pipe(reader, writer) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
