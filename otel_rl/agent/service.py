"""The agent process: serves every producer whose segment is in its directory.

One agent per directory (an exclusive ``flock`` on its lock file). It looks
for new segments every :data:`SCAN_S` (a ``stat`` of the directory: it is
listed only when its modification time moved) and serves each new one with a
:class:`~otel_rl.agent.serve.SegmentServer`, with outputs built from that
producer's :class:`~otel_rl.core.identity.RunIdentity`. The agent runs at a
lower scheduling priority than training (``nice`` +:data:`NICENESS`): under CPU
pressure training wins, and the segment's bounded lanes absorb the burst. Producers of one run see each other here:

* a worker (a role other than ``learner``) relays its cycles straight into the
  learner's outputs, so the learner's panel and live metrics show the
  collector timeline;
* every rank writes its Perfetto trace, the machine's first learner rank the
  machine's part and the others fragments it takes in, so every local rank is
  a process of one trace and stragglers show;
* the first rank's outputs close after the other producers' of its run that
  are ending (dead or closing), so their fragments are complete when it merges them.

The agent started for one process (``agent="process"``) ends shortly after its
last producer; one started by name (``OTEL_RL_AGENT=NAME``) lingers for
producers still to come; ``otel-rl agent NAME`` serves until interrupted.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from otel_rl.agent import directory as agents
from otel_rl.agent.logs import LogForwarder
from otel_rl.agent.serve import SegmentServer, serve_segment
from otel_rl.base import extras
from otel_rl.base.deadline import Deadline
from otel_rl.base.log import logger
from otel_rl.base.loops import BackgroundLoop
from otel_rl.base.processes import pid_alive
from otel_rl.core.identity import RunIdentity
from otel_rl.formats import schema
from otel_rl.shm import segment as shm

_logger = logger(__name__)

SCAN_S = 0.05
"""How often the directory's modification time is checked for new segments."""
RESCAN_S = 1.0
"""How often the directory is listed anyway (its time has a coarse clock: a segment made in the tick of a listing)."""
NICENESS = 5
"""How much lower than training the agent process runs (``os.nice``)."""
GC_THRESHOLDS = (20_000, 20, 100)
"""The agent process's cyclic garbage collector thresholds (``gc.set_threshold``; Python's are 700, 10, 10).

Its records die by reference counting at the end of each pass; collecting
every 700 allocations only walked them (about a tenth of the agent's CPU).
Cycles still go within 20,000 allocations.
"""
GROUP_WAIT_S = 3.0
"""How long a worker waits for its learner's outputs before it is served alone."""
WORKERS_WAIT_S = 5.0
"""How long a learner's close waits for the outputs of its ending workers."""


@dataclass
class Served:
    """One producer this agent serves."""

    path: Path
    reader: shm.SegmentReader
    identity: RunIdentity
    server: SegmentServer | None = None
    built: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def config(self) -> Any:
        return self.identity.config

    @property
    def leads(self) -> bool:
        """Its machine's first learner rank: the others of its run relay to it and its part of the trace takes theirs in."""
        return self.config.role == schema.LEARNER and self.config.first_on_node

    def leads_for(self, other: Served) -> bool:
        return self.leads and self.config.run_id == other.config.run_id and self.config.node_rank == other.config.node_rank

    def ending(self) -> bool:
        """Its producer closed or died: its outputs are about to close."""
        return self.reader.get("state") == shm.CLOSING or not pid_alive(self.identity.pid)


class LocalRelay:
    """Hands a worker's cycles to its learner's outputs in this process (the queue a relay sink expects)."""

    def __init__(self, learner: Served) -> None:
        self._learner = learner

    def put_nowait(self, cycle: Any) -> None:
        self._learner.server.producer.inbox.add_remote(cycle)  # type: ignore[union-attr]


class AgentService(BackgroundLoop):
    """Serves the segments of ``directory`` until none is left for ``linger_s`` (or forever)."""

    def __init__(self, directory: Path, linger_s: float | None) -> None:
        super().__init__("otel-rl-agent-service", SCAN_S)
        self.directory = directory
        self.linger_s = linger_s
        self._served: dict[Path, Served] = {}
        self._unservable: set[Path] = set()  # orphans whose outputs need a package this process lacks
        self._lock = threading.Lock()
        self._logs = LogForwarder.install()
        self._listed_ns = -1
        self._listed_at = 0.0
        self._idle_since = time.monotonic()
        self.ended = threading.Event()

    def run(self) -> int:
        """0 when it served until idle; 0 too when another agent already serves the directory."""
        lock = agents.lock_agent(self.directory)
        if lock is None:
            return 0
        try:
            os.nice(NICENESS)
        except OSError:
            pass
        gc.set_threshold(*GC_THRESHOLDS)
        try:
            with contextlib.suppress(OSError):  # a full /dev/shm: the lock holds, it just cannot name this agent
                os.ftruncate(lock, 0)
                os.write(lock, str(os.getpid()).encode())
            self.start()
            self.ended.wait()
            if self.linger_s is not None:  # started by a producer: it leaves no directory behind
                agents.remove_if_empty(self.directory)
        finally:
            os.close(lock)
        return 0

    def run_once(self) -> None:
        if self.ended.is_set():
            return
        self._scan()
        with self._lock:
            # A producer served to the end is forgotten once its segment is gone (an agent may serve for days).
            self._served = {p: s for p, s in self._served.items() if not s.done.is_set() or p.exists()}
            busy = any(not s.done.is_set() for s in self._served.values())
        if busy:
            self._idle_since = time.monotonic()
        elif self.linger_s is not None and time.monotonic() - self._idle_since >= self.linger_s:
            self._scan(force=True)  # a producer that came in the last moment is served before the lock goes
            with self._lock:
                if all(s.done.is_set() for s in self._served.values()):
                    self.ended.set()
                    self.close(Deadline(0))

    def _scan(self, force: bool = False) -> None:
        try:
            listed_ns = os.stat(self.directory).st_mtime_ns
            if listed_ns == self._listed_ns and not force and time.monotonic() - self._listed_at < RESCAN_S:
                return  # no segment came or went
            self._listed_ns, self._listed_at = listed_ns, time.monotonic()
            paths = sorted(self.directory.glob("*.seg"), key=_created)
        except OSError:
            return
        for path in paths:
            with self._lock:
                known = path in self._served or path in self._unservable
            if known:
                continue
            try:
                reader = shm.SegmentReader(path)
            except (OSError, ValueError):  # removed meanwhile, or still being created: listed again next time
                self._listed_ns = -1
                continue
            if reader.get("agent_state") == shm.AGENT_DONE or not reader.claim():  # done, or another reads it
                reader.close()
                continue
            try:
                identity = pickle.loads(reader.config())
            except Exception as exc:  # a configuration this process cannot import, say
                _logger.warning("otel-rl: agent: cannot read the configuration of %s (%s); not served", path.name, exc)
                if not pid_alive(reader.get("pid")):  # no agent will ever read it: its memory goes
                    path.unlink(missing_ok=True)
                reader.close()
                continue
            if not pid_alive(identity.pid) and extras.missing_outputs(identity.config):
                reader.close()  # a dead producer's run is finished only where all its outputs can be built
                self._unservable.add(path)
                continue
            served = Served(path, reader, identity)
            with self._lock:
                self._served[path] = served
            threading.Thread(target=self._serve, args=(served,), name=f"otel-rl-agent-{identity.pid}", daemon=True).start()

    def _serve(self, served: Served) -> None:
        reader, identity = served.reader, served.identity
        LogForwarder.serving(reader, identity.pid)
        self._logs.add(reader, identity.pid)
        try:
            config = identity.config
            learner = None if served.leads or config.role == schema.LEARNER else self._learner_of(served)
            if learner is not None and learner.server is not None:  # a worker: its cycles go to the learner's panel and live metrics
                config = replace(config, relay=LocalRelay(learner))
            before_close = (lambda: self._wait_for_workers(served)) if served.leads else None
            served.server = serve_segment(reader, replace(identity, config=config), before_close=before_close)
            served.built.set()
            served.server.done.wait()
        except Exception as exc:  # the producer serves its segment itself at close, or says it cannot
            _logger.warning("otel-rl: agent: serving %s failed (%s: %s)", served.path.name, type(exc).__name__, exc)
        finally:
            served.built.set()
            self._logs.remove(reader)
            done = reader.get("agent_state") == shm.AGENT_DONE
            reader.close()
            if done:
                served.path.unlink(missing_ok=True)
            served.done.set()
            self.wake()

    def _learner_of(self, served: Served) -> Served | None:
        """The first learner rank of ``served``'s run on this machine, once its outputs are built; None if it does not come."""
        deadline = time.monotonic() + GROUP_WAIT_S
        while True:
            with self._lock:
                found = [s for s in self._served.values() if s.leads_for(served)]
            if found:
                found[0].built.wait(max(0.0, deadline - time.monotonic()))
                return found[0] if found[0].server is not None and not found[0].done.is_set() else None
            if time.monotonic() >= deadline:
                return None
            time.sleep(SCAN_S)

    def _wait_for_workers(self, learner: Served) -> None:
        """Before the first rank's outputs close: let its run's ending workers and ranks close first (their trace fragments)."""
        deadline = time.monotonic() + min(WORKERS_WAIT_S, learner.config.shutdown_timeout_s / 2)
        while time.monotonic() < deadline:
            with self._lock:
                waiting = [
                    s for s in self._served.values()
                    if s is not learner and s.config.run_id == learner.config.run_id and not s.done.is_set() and s.ending()
                ]
            if not waiting:
                return
            waiting[0].done.wait(max(0.0, deadline - time.monotonic()))


def _created(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def main(directory: str, linger_s: float | None) -> int:
    """``python -m otel_rl.agent --dir DIRECTORY``: serve it (see :class:`AgentService`)."""
    return AgentService(Path(directory), linger_s).run()
