"""The live terminal panel: what the training is doing, redrawn at 2 Hz by its own thread.

It reads the pipeline's records (a :class:`~otel_rl.core.pipeline.RecordSink`) into
bounded windows and shows 2-second averages ("Avg 2s (n=...)"). The backends
keep each ``scalars()`` call's values as recorded, and the phase timings
(``Perf/*``) as at most one record a second: an iteration longer than that
is its own record, faster ones are averaged, ``Perf/window_iterations`` saying
over how many. The training loop never triggers a
redraw. Width tiers: under 96 columns everything stacks with a single Timing
column; from 96 metrics and rewards sit side by side with Learner and
Collector timing; from 120 a System column joins. When stdout is not a
terminal, a plain line is printed every few seconds instead.

What it shows, in a fixed order. Metrics: Steps/s (and Rows/s, the replay
rows the learner takes, where a run of one rank logs ``Train/batch_size``),
then ``Loss/*`` (red above 10), ``Policy/*``, the other ``Train/*`` keys as
indented training diagnostics, the replay-ingress gauges
(``Train/ingress_<name>``: "Ingress Backpressure", "Ingress Depth"...) and
every custom group under its name. Rewards: the mean reward and its peak, the
episode length, ``reward/*`` terms and ``Episode/*``. System: envs, buffer,
the envs' timeout and terminated rates (``Episode/timeout_rate``,
``Episode/terminated_rate``), the batch per rank (``Train/batch_size``), CUDA
MPS (``Train/cuda_mps``: 0 off, 1 on, 2 ambient), Sync Collect
(``Train/sync_collect_steps``: env steps per sync, 0 for none) and the staging
pool (``Train/staging_pool_len`` of ``Train/staging_pool_max``) where the loop
logs them, CPU, memory and GPUs. Under the tables, the live verdict
(:mod:`otel_rl.core.live_verdict`: "Bottleneck: collector (env step)", with
its caveat when it is not sure). Timing: a Collector Wait above 1 ms is red;
quiet collector diagnostics and nested rows show from 1% of the cycle; a
custom nested phase sits under its parent. The status under the panel:
``tel.status(text)``'s latest (one that says error or fail redraws at once),
else "Buffer fill: x/y (p%)" while ``Train/buffer_size`` is below
``Train/learning_starts``, else "Warming up" before the first iteration.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from otel_rl.base import terminal
from otel_rl.base.deadline import Deadline
from otel_rl.base.loops import BackgroundLoop
from otel_rl.core.batches import ScalarBatch
from otel_rl.core.pipeline import RecordSink
from otel_rl.core.records import EventRecord, RunStart
from otel_rl.core.totals import PassTotals
from otel_rl.formats import schema

WINDOW_S = 2.0
REFRESH_HZ = 2.0
MAX_DUTY = 0.01
"""Share of a core the panel may spend redrawing; a slow terminal or a busy machine redraws less often."""
PLAIN_EVERY_S = 5.0
QUIET_SHARE = 0.01
"""Nested and diagnostic collector rows below this share of the cycle are not shown."""
QUIET_COLLECTOR = frozenset({"inference_request", "transition_extract", "metrics_publish", "action_validate", "action_apply", "action_backend", "backend_step", "update_state", "reset_done"})
"""Collector diagnostics shown only from :data:`QUIET_SHARE` of the cycle; the core rows always are."""
LOSS_ALERT = 10.0
"""A loss above this is red."""
WAIT_ALERT_MS = 1.0
"""A learner Collector Wait above this is red: the learner starves."""
ELSEWHERE = frozenset({
    "Train/mean_reward", "Train/mean_episode_length", "Train/buffer_size", "Train/learning_starts", "Train/batch_size",
    "Train/cuda_mps", "Train/sync_collect_steps", "Train/staging_pool_len", "Train/staging_pool_max",
    "Episode/timeout_rate", "Episode/terminated_rate",
})  # fmt: skip
"""Keys the Rewards and System columns and the status show, not the Metrics column."""
NOT_METRICS = ("Perf/", "sys/", "reward/", "Episode/", "axis/", "events/")
"""Families shown elsewhere (timings, system, rewards) or not at all."""
MPS_STATES = {0: "off", 1: "on", 2: "ambient"}
MAX_CUSTOM_ROWS = 24
MAX_FAMILY_ROWS = 8
"""Keys shown of one of the loop's own groups (TRL's two dozen ``trl/*``): the rest are counted on a line."""
"""Rows of custom groups the Metrics column shows at most."""
STATUS_EVENT = "status"
"""The event ``tel.status(text)`` records: its ``text`` is the panel's status line."""


def round_to_total(shares: list[float], decimals: int = 1) -> list[float]:
    """Round shares (fractions of 1) to percentages with ``decimals`` that add up to exactly 100."""
    scale = 10**decimals
    raw = [s * 100 * scale for s in shares]
    floors = [int(r) for r in raw]
    missing = round(sum(raw)) - sum(floors)
    order = sorted(range(len(raw)), key=lambda i: raw[i] - floors[i], reverse=True)
    for i in order[: max(missing, 0)]:
        floors[i] += 1
    return [f / scale for f in floors]


class SlidingWindow:
    """Sums and counts per key over about the last ``window_ns``, kept in time buckets.

    Each record is a tuple of dicts (its parts). A record is added into the
    bucket of its time (a twentieth of the window), so nothing is kept per
    record: adding costs O(keys) and leaves no object behind for the garbage
    collector, reading costs O(buckets x keys). The window is exact to one
    bucket. Thread-safe: the pipeline adds, the render thread reads.
    """

    BUCKETS = 20

    def __init__(self, window_ns: int, parts: int) -> None:
        self._window_ns = window_ns
        self._width = max(window_ns // self.BUCKETS, 1)
        self._parts = parts
        # bucket index -> [records, sums per part, counts per part]
        self._buckets: dict[int, list] = {}
        self._lock = threading.Lock()

    def add(self, time_ns: int, *parts: dict, records: int = 1) -> None:
        """Add ``records`` records (1, or many already summed into ``parts``) at ``time_ns``."""
        index = time_ns // self._width
        with self._lock:
            bucket = self._buckets.get(index)
            if bucket is None:
                if len(self._buckets) > 2 * self.BUCKETS:  # bounded whatever the timestamps
                    del self._buckets[min(self._buckets)]
                bucket = self._buckets[index] = [0, [{} for _ in range(self._parts)], [{} for _ in range(self._parts)]]
            bucket[0] += records
            for sums, counts, values in zip(bucket[1], bucket[2], parts, strict=True):
                for key, value in values.items():
                    if value is not None:
                        sums[key] = sums.get(key, 0) + value
                        counts[key] = counts.get(key, 0) + 1

    def read(self, now_ns: int) -> tuple[int, list[dict[str, float]], list[dict[str, int]]]:
        """(records in the window, sums per part, counts per part); older buckets are dropped."""
        first = (now_ns - self._window_ns) // self._width + 1  # the oldest bucket ending inside the window
        records = 0
        sums: list[dict[str, float]] = [{} for _ in range(self._parts)]
        counts: list[dict[str, int]] = [{} for _ in range(self._parts)]
        with self._lock:
            for index in [i for i in self._buckets if i < first]:
                del self._buckets[index]
            for n, bucket_sums, bucket_counts in self._buckets.values():
                records += n
                for total, bucket in zip(sums, bucket_sums):
                    for key, value in bucket.items():
                        total[key] = total.get(key, 0) + value
                for total, bucket in zip(counts, bucket_counts):
                    for key, value in bucket.items():
                        total[key] = total.get(key, 0) + value
        return records, sums, counts


STEP_HISTORY = 100
"""Passes (about 10 s) over which the env-step rate of the ETA is measured."""

SAMPLE_NS = 10_000_000
"""Records of the same keys closer than this are left out of the panel's means (at most 100 a second)."""


class PanelState:
    """2-second windows of recent records, kept as bucketed sums (see :class:`SlidingWindow`)."""

    def __init__(self, clock: Callable[[], int] = time.time_ns, derive_fps: bool = False) -> None:
        self._clock = clock
        self.derive_fps = derive_fps
        """Steps/s from the env steps, where the loop does not log ``Perf/total_fps`` (a run of one rank)."""
        window = int(WINDOW_S * 1e9)
        self.learner = SlidingWindow(window, parts=3)
        self.collector = SlidingWindow(window, parts=3)
        self.scalars = SlidingWindow(window, parts=1)
        self.latest: dict[str, Any] = {}
        self._sampled: tuple[Any, int] = ((), 0)  # the keys and time of the last record added to the window
        self.started_ns: int | None = None
        """When the run started (epoch ns), None before."""
        self.total_steps: int | None = None
        self._steps: deque[tuple[int, int]] = deque(maxlen=STEP_HISTORY)  # (time, env steps), one per pass
        self.iteration: int | None = None
        """The index of the latest local iteration (of the learner's, when there is one), None before any."""
        self.under_way: dict[str, tuple[int, int | None, int]] = {}
        """Per timeline, the iteration still open (index, env steps at its start, start epoch ns): progress counts it."""
        self.parents: dict[str, str] = {}
        """Each custom nested phase's top-level phase."""
        self.status: str | None = None
        """The loop's latest ``tel.status()``."""
        self.bottleneck: str | None = None
        self._last: dict[str, tuple[int, int, int, dict[str, int], dict[str, int]]] = {}
        """Per timeline, the latest pass's cycles (time, count, wall, top, nested): shown when none ended in the window."""
        """The live verdict's latest line, with its caveat when it is not sure."""
        self.warmed_up = False
        """A ``warmup_done`` event or a first iteration came."""
        self.reward_peak: float | None = None
        """The highest ``Train/mean_reward`` so far."""

    def add_pass(self, totals: PassTotals) -> None:
        """The cycles of one pipeline pass, local and relayed from workers; nanoseconds are kept, rendering converts."""
        steps = None
        for timeline, cycles in totals.timelines.items():
            if cycles.cycles:
                self.warmed_up = True  # the first iteration ends the warm-up
                target = self.learner if timeline == schema.LEARNER else self.collector
                target.add(totals.time_ns, {"wall": cycles.wall_ns}, cycles.top, cycles.nested, records=cycles.cycles)
                self._last[timeline] = (totals.time_ns, cycles.cycles, cycles.wall_ns, dict(cycles.top), dict(cycles.nested))
            if cycles.env_steps is not None and (steps is None or cycles.env_steps > steps):
                steps = cycles.env_steps
            opened = self.under_way.get(timeline)
            if cycles.under_way is not None:
                self.under_way[timeline] = opened = cycles.under_way
            elif opened is not None and cycles.index is not None and cycles.index >= opened[0]:
                del self.under_way[timeline]  # it ended, and no other opened after it
                opened = None
            if opened is not None and opened[1] is not None and (steps is None or opened[1] > steps):
                steps = opened[1]  # the env steps done before the iteration under way began
            if cycles.index is not None and (timeline == schema.LEARNER or schema.LEARNER not in totals.timelines):
                self.iteration = cycles.index
            if cycles.parents:
                self.parents.update(cycles.parents)
        if steps is not None and (not self._steps or steps > self._steps[-1][1]):
            self._steps.append((totals.time_ns, steps))

    def progress(self) -> dict[str, float | int | None]:
        """Elapsed seconds, env steps so far and planned, and the ETA at the recent rate (None where unknown)."""
        now = self._clock()
        out: dict[str, float | int | None] = {"elapsed_s": None, "env_steps": None, "total_steps": self.total_steps, "eta_s": None}
        if self.started_ns is not None:
            out["elapsed_s"] = max(now - self.started_ns, 0) / 1e9
        if self._steps:
            (t0, s0), (t1, s1) = self._steps[0], self._steps[-1]
            out["env_steps"] = s1
            if self.total_steps and t1 > t0 and s1 > s0:
                out["eta_s"] = max(self.total_steps - s1, 0) / ((s1 - s0) / ((t1 - t0) / 1e9))
        return out

    def iteration_under_way(self) -> tuple[int, float] | None:
        """The learner's (else another timeline's) iteration open for longer than the window, and for how many seconds:
        a long iteration (a rollout and its update) is counted while it runs; None where none is."""
        for timeline in (schema.LEARNER, *self.under_way):
            opened = self.under_way.get(timeline)
            if opened is None:
                continue
            index, _, start_ns = opened
            if self.iteration is not None and index <= self.iteration and timeline == schema.LEARNER:
                return None
            seconds = max(self._clock() - start_ns, 0) / 1e9
            return (index, seconds) if seconds >= WINDOW_S else None
        return None

    def steps_per_s(self) -> float | None:
        """Env steps per second over the window, from the passes' env steps (None without two of them in it)."""
        if len(self._steps) < 2:
            return None
        t1, s1 = self._steps[-1]
        since = t1 - int(WINDOW_S * 1e9)
        t0, s0 = next(((t, s) for t, s in self._steps if t >= since), self._steps[0])
        return (s1 - s0) / ((t1 - t0) / 1e9) if t1 > t0 else None

    def add_scalars(self, batch: ScalarBatch) -> None:
        """Latest values always; into the means, calls of the same keys at most every :data:`SAMPLE_NS`."""
        latest = batch.latest_values()
        self.latest.update(latest)
        reward = latest.get("Train/mean_reward")
        if reward is not None and (self.reward_peak is None or reward > self.reward_peak):
            self.reward_peak = reward
        keys, at_ns = self._sampled
        sampled = []
        for index, time_ns in enumerate(batch.times_ns.tolist()):
            # A loop that logs every iteration: a sample of its calls makes the same 2-second means.
            if time_ns - at_ns >= SAMPLE_NS or batch.names != keys:
                keys, at_ns = batch.names, time_ns
                sampled.append(index)
        for record in batch.at(sampled):  # only the sampled records are built
            self.scalars.add(record.time_ns, record.values)
        self._sampled = (keys, at_ns)

    def learner_rate(self) -> float | None:
        """Learner iterations per second over the window (None before any)."""
        n, _, _ = self.learner.read(self._clock())
        if not n:
            return None
        span = WINDOW_S if self.started_ns is None else min(WINDOW_S, max(self._clock() - self.started_ns, 1) / 1e9)
        return n / span

    def status_line(self) -> str | None:
        """The loop's status, else the replay buffer's fill before learning starts, else "Warming up" before any iteration."""
        if self.status:
            return self.status
        size, starts = self.latest.get("Train/buffer_size"), self.latest.get("Train/learning_starts")
        if size is not None and starts and size < starts:
            return f"Buffer fill: {size:,.0f}/{starts:,.0f} ({100 * size / starts:.0f}%)"
        if not self.warmed_up:
            return "Warming up..."
        return None

    def job_timing(self) -> dict[str, Any] | None:
        """The learner's window over the job's ranks, from the per-rank timings ``log_window`` records on rank 0
        (``Perf/rank_<n>/...``): each rank's means averaged, ``n`` the rank samples; None where there are none."""
        _, (sums,), (counts,) = self.scalars.read(self._clock())
        ranks: dict[int, dict[str, float]] = {}
        for key, total in sums.items():
            parsed = schema.parse_rank_key(key)
            if parsed is not None:
                ranks.setdefault(parsed[0], {})[parsed[1]] = total / counts[key]
        walls = [own["Perf/iteration_time"] * 1e3 for own in ranks.values() if "Perf/iteration_time" in own]
        if not walls:
            return None
        top: dict[str, float] = {}
        nested: dict[str, float] = {}
        for own in ranks.values():
            for key, value in own.items():
                name = _learner_phase(key)
                if name is None:
                    continue
                spec = schema.PHASES.get((schema.LEARNER, name))
                into = nested if (spec is not None and spec.parent) or name in self.parents else top
                into[name] = into.get(name, 0.0) + value / schema.phase_key_scale(schema.LEARNER, name) / len(ranks)  # in ms
        samples = sum(counts.get(schema.rank_key(rank, "Perf/iteration_time"), 0) for rank in ranks)
        return {"n": samples, "wall_ms": sum(walls) / len(walls), "top": top, "nested": nested, "ranks": len(ranks)}

    def timing(self, timeline: str) -> dict[str, Any]:
        """Window means per cycle: cycle wall, top-level and nested phase ms, and n; the learner's over the job's
        ranks where ``log_window`` recorded them (``ranks``: how many)."""
        if timeline == schema.LEARNER:
            job = self.job_timing()
            if job is not None:
                return job
        now = self._clock()
        n, (wall, top, nested), _ = (self.learner if timeline == schema.LEARNER else self.collector).read(now)
        extra: dict[str, Any] = {}
        if not n:
            last = self._last.get(schema.LEARNER if timeline == schema.LEARNER else schema.COLLECTOR)
            if last is None:
                return {"n": 0}
            # Cycles longer than the window (a long rollout and its update): the last complete ones, and how long ago they ended.
            at_ns, n, wall_ns, top, nested = last
            wall = {"wall": wall_ns}
            extra["ago_s"] = max(now - at_ns, 0) / 1e9
        return {
            "n": n,
            "wall_ms": wall.get("wall", 0) / n / 1e6,
            "top": {k: v / n / 1e6 for k, v in top.items()},
            "nested": {k: v / n / 1e6 for k, v in nested.items()},
            **extra,
        }

    def scalar_means(self) -> dict[str, float]:
        _, (sums,), (counts,) = self.scalars.read(self._clock())
        means = {k: sums[k] / counts[k] for k in sums}
        for key, value in self.latest.items():
            if value is not None:
                means.setdefault(key, value)  # keys not updated in the window keep their last value
        return means


def _under_way_words(under_way: tuple[int, float] | None) -> str:
    """``iteration 3 under way for 12s`` (:meth:`PanelState.iteration_under_way`), empty for none."""
    return "" if under_way is None else f"iteration {under_way[0]:,} under way for {_duration(under_way[1])}"


def _window_words(timing: dict[str, Any], under_way: tuple[int, float] | None = None) -> str:
    """What the timing table is over: the window's average, or the last iterations where none ended in the window
    (and the iteration under way, when one has run for longer than the window)."""
    n = timing.get("n", 0)
    now = _under_way_words(under_way)
    if "ago_s" in timing:
        return f"Last {n} iteration{'s' if n > 1 else ''} ({_duration(timing['ago_s'])} ago{'; ' + now if now else ''})"
    if not n and now:
        return now[0].upper() + now[1:]
    return f"Avg {WINDOW_S:.0f}s (n={n})"


def _learner_phase(key: str) -> str | None:
    """The learner phase a job's timing key is of (``Perf/learner_replay_sample_ms``: ``replay_sample``), None for others."""
    parsed = schema.parse_phase_key(key)
    return parsed[1] if parsed is not None and parsed[0] == schema.LEARNER else None


_title = schema.phase_title


def timing_rows(timing: dict[str, Any], timeline: str, parents: dict[str, str] | None = None) -> list[tuple[str, str, str]]:
    """(label, ms, share) rows; top-level rows and Other add up to exactly 100%.

    Nested rows follow their parent (``parents``: a custom nested phase's); the
    collector's nested rows and quiet diagnostics show from :data:`QUIET_SHARE`.
    """
    if not timing.get("n"):
        return [("(no data yet)", "", "")]
    wall = timing["wall_ms"]
    top = sorted(timing["top"].items(), key=lambda kv: -kv[1])
    if timeline == schema.COLLECTOR and not wall:
        wall = sum(v for _, v in top)
    accounted = sum(v for _, v in top)
    other = max(wall - accounted, 0.0)
    shares = round_to_total([v / wall for _, v in top] + [other / wall] if wall else [0.0] * (len(top) + 1))
    label = "Iter Wall" if timeline == schema.LEARNER else "Cycle"
    rows = [(label, f"{wall:.2f}", "100.0%")]
    parents = parents or {}
    quiet = timeline == schema.COLLECTOR and wall
    for (name, ms), share in zip(top, shares, strict=False):
        if quiet and name in QUIET_COLLECTOR and ms / wall < QUIET_SHARE:
            continue  # counted in the shares, shown only when it matters
        rows.append((_title(timeline, name), f"{ms:.2f}", f"{share:.1f}%"))
        for child, child_ms in timing["nested"].items():
            spec = schema.PHASES.get((timeline, child))
            parent = spec.parent if spec is not None and spec.parent else parents.get(child)
            if parent == name and (timeline == schema.LEARNER or child_ms / wall >= QUIET_SHARE):
                rows.append(("  " + _title(timeline, child), f"{child_ms:.2f}", f"{100 * child_ms / wall:.1f}%"))
    if timeline == schema.LEARNER or other / wall >= QUIET_SHARE:
        rows.append(("Other", f"{other:.2f}", f"{shares[-1]:.1f}%"))
    return rows


def ema_rows(means: dict[str, float]) -> list[tuple[str, str, str]]:
    """A collector that reports its own timings (``Perf/collector_<phase>_ms``, per-step EMAs as APPO's do, and its
    rollout wall ``Perf/collection_time``) rather than recording phases: ms rows without shares (they are no
    breakdown of one cycle), empty when it reports none."""
    prefix = "Perf/collector_"
    rows = [(_title(schema.COLLECTOR, key[len(prefix) : -len("_ms")]), f"{value:.2f}", "EMA")
            for key, value in sorted(means.items()) if key.startswith(prefix) and key.endswith("_ms")]  # fmt: skip
    if "Perf/collection_time" in means:
        rows.append(("Rollout Wall", f"{means['Perf/collection_time'] * 1e3:.2f}", ""))
    return rows


def _alert_wait(rows: list[tuple[str, str, str]]) -> list[tuple[Any, ...]]:
    """The learner's rows with its Collector Wait coloured: red above :data:`WAIT_ALERT_MS`, else yellow."""
    wait = _title(schema.LEARNER, "collector_wait")
    return [(label, Text(ms, style="red" if float(ms) > WAIT_ALERT_MS else "yellow"), share) if label == wait and ms else (label, ms, share)
            for label, ms, share in rows]  # fmt: skip


def _status_style(status: str) -> str:
    return "bold red" if _says_error(status) else "dim"


def _says_error(text: str) -> bool:
    lowered = text.lower()
    return "error" in lowered or "fail" in lowered


def _duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _fmt(value: float) -> str:
    if abs(value) >= 1e9:
        return f"{value / 2**30:.2f} Gi"
    if abs(value) >= 1e6:
        return f"{value / 2**20:.1f} Mi"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


class PanelView:
    """Builds the renderable for a console width from a :class:`PanelState`."""

    def __init__(self, state: PanelState, run_id: str, num_envs: Callable[[], int | None] = lambda: None, machines: int = 1) -> None:
        self.state = state
        self.run_id = run_id
        self._num_envs = num_envs
        self.machines = machines
        """Machines in the job: the GPUs the title counts are this machine's times them."""

    def _kv_table(self, title: str, rows: list[tuple[str, str]]) -> Table:
        table = Table(title=title, show_header=False, box=None, title_justify="left", pad_edge=False)
        table.add_column(style="cyan", no_wrap=True)
        table.add_column(justify="right", no_wrap=True)
        for row in rows or [("(none yet)", "")]:
            table.add_row(*row)
        return table

    def _timing_table(self, title: str, rows: list[tuple[str, str, str]]) -> Table:
        table = Table(title=title, box=None, title_justify="left", pad_edge=False)
        table.add_column("phase", style="cyan", no_wrap=True)
        table.add_column("ms", justify="right", no_wrap=True)
        table.add_column("share", justify="right", no_wrap=True)
        for row in rows:
            table.add_row(*row)
        return table

    def sections(self, short: bool) -> dict[str, Any]:
        means = self.state.scalar_means()
        return {"metrics": self._metrics(means, short), "rewards": self._rewards(means, short), "system": self._system(means)}

    def _metrics(self, means: dict[str, float], short: bool) -> list[tuple[str, Any]]:
        """Throughput, then losses, policy, training diagnostics (indented), ingress gauges and custom groups."""
        rows: list[tuple[str, Any]] = [("Steps/s" if short else "Steps/s (Perf/total_fps)", _fmt(means["Perf/total_fps"]))] if "Perf/total_fps" in means else []
        derived = None if rows or not self.state.derive_fps else self.state.steps_per_s()
        if derived is not None:  # the loop logs none: from its env steps and the time
            rows = [("Steps/s", _fmt(derived))]
        if schema.TOKENS_PER_S in means:  # an LLM-RL step's tokens per second (TRL, verl)
            rows.append(("Tokens/s", _fmt(means[schema.TOKENS_PER_S])))
        rate = self.state.learner_rate() if self.state.derive_fps and "Train/batch_size" in means else None
        if rate is not None:  # the replay rows the learner takes: shown, never persisted
            rows.append(("Rows/s", _fmt(means["Train/batch_size"] * rate)))
        distributions = {key.removesuffix("/mean") for key in means if key.endswith("/mean") and f"{key[:-5]}/std" in means}
        groups: dict[str, list[str]] = {}
        for key in sorted(means):
            base = key.rsplit("/", 1)[0]
            if key in ELSEWHERE or key.startswith(NOT_METRICS) or (base in distributions and not key.endswith("/mean")):
                continue
            family = key.split("/", 1)[0] if "/" in key else ""
            groups.setdefault(family, []).append(key)

        def label(key: str) -> str:
            name = key.removesuffix("/mean") if key.removesuffix("/mean") in distributions else key
            return name.split("/", 1)[1] if short and "/" in name else name

        def value(key: str) -> str:
            base = key.removesuffix("/mean")
            return f"{_fmt(means[key])} ± {_fmt(means[base + '/std'])}" if base in distributions and key.endswith("/mean") else _fmt(means[key])

        for key in groups.pop("Loss", []):
            rows.append((label(key), Text(value(key), style="red" if means[key] > LOSS_ALERT else "yellow")))
        rows += [(label(key), value(key)) for key in groups.pop("Policy", [])]
        train = groups.pop("Train", [])
        rows += [("  " + label(key), value(key)) for key in train if not key.startswith("Train/ingress_")]  # training diagnostics
        rows += [("Ingress " + key.removeprefix("Train/ingress_").replace("_", " ").title(), value(key)) for key in train if key.startswith("Train/ingress_")]
        custom: list[tuple[str, Any]] = []
        for family, keys in sorted(groups.items()):  # the loop's own groups, each under its name
            custom.append((Text(family or "custom", style="bold"), ""))
            custom += [("  " + (key.split("/", 1)[1] if "/" in key else key), value(key)) for key in keys[:MAX_FAMILY_ROWS]]
            if len(keys) > MAX_FAMILY_ROWS:
                custom.append((Text(f"  ... {len(keys) - MAX_FAMILY_ROWS} more {family or 'custom'} keys", style="dim"), ""))
        if len(custom) > MAX_CUSTOM_ROWS:  # hundreds of keys: the panel stays a panel
            hidden = sum(1 for name, _ in custom[MAX_CUSTOM_ROWS - 1 :] if isinstance(name, str))
            custom = [*custom[: MAX_CUSTOM_ROWS - 1], (Text(f"... {hidden:,} more keys (metrics.jsonl has them all)", style="dim"), "")]
        return rows + custom

    def _rewards(self, means: dict[str, float], short: bool) -> list[tuple[str, Any]]:
        """The mean reward and its peak, the episode length, the reward terms and the other episode statistics."""
        rows: list[tuple[str, Any]] = []
        if "Train/mean_reward" in means:
            digits = 1 if short else 3  # a narrow panel keeps its labels and gives up precision
            rows.append(("Mean reward" if short else "Train/mean_reward", f"{means['Train/mean_reward']:.{digits}f}"))
            if self.state.reward_peak is not None:
                rows.append(("Peak reward", f"{self.state.reward_peak:.{digits}f}"))
        if "Train/mean_episode_length" in means:
            rows.append(("Episode length", _fmt(means["Train/mean_episode_length"])))
        for key in sorted(k for k in means if k.startswith("reward/")):
            rows.append((key.split("/", 1)[1] if short else key, f"{means[key]:.3g}"))
        for key in sorted(k for k in means if k.startswith("Episode/") and k not in ELSEWHERE):
            rows.append((key.split("/", 1)[1] if short else key, _fmt(means[key])))
        return rows

    def _system(self, means: dict[str, float]) -> list[tuple[str, Any]]:
        """Envs, buffer, the envs' end rates, batch, MPS, sync and staging where logged, CPU, memory and GPUs."""
        system: list[tuple[str, Any]] = [
            ("Envs", str(self._num_envs() or "-")),
            ("Buffer", _fmt(means["Train/buffer_size"]) if "Train/buffer_size" in means else "-"),
        ]
        for key, name in (("Episode/timeout_rate", "Timeout Rate"), ("Episode/terminated_rate", "Terminated Rate")):
            if key in means:
                system.append((name, f"{100 * means[key]:.1f}%"))
        if "Train/batch_size" in means:
            system.append(("Batch/rank", _fmt(means["Train/batch_size"])))
        if "Train/cuda_mps" in means:
            system.append(("CUDA MPS", MPS_STATES.get(round(self.state.latest.get("Train/cuda_mps", means["Train/cuda_mps"])), "?")))
        if "Train/sync_collect_steps" in means:
            steps = self.state.latest.get("Train/sync_collect_steps", means["Train/sync_collect_steps"])
            system.append(("Sync Collect", f"✓ ({steps:,.0f})" if steps else "✗"))
        if "Train/staging_pool_max" in means:
            size, most = self.state.latest.get("Train/staging_pool_len", 0) or 0, means["Train/staging_pool_max"]
            system.append(("Staging Pool", Text(f"{size:.0f}/{most:.0f}", style="green" if size < most else "yellow")))
        system += [("CPU", f"{means.get('sys/process_cpu_percent', 0):.0f}%"), ("RSS", _fmt(means.get("sys/process_rss_bytes", 0)) + "B")]
        for key in sorted(k for k in means if k.startswith("sys/gpu") and k.endswith("_util_percent")):
            system.append((key.removeprefix("sys/").removesuffix("_util_percent").upper(), f"{means[key]:.0f}%"))
        return system

    def render(self, width: int):
        learner = self.state.timing(schema.LEARNER)
        collector = self.state.timing(schema.COLLECTOR)
        short = width < 96
        parts = self.sections(short)
        metrics = self._kv_table("Metrics", parts["metrics"])
        rewards = self._kv_table("Rewards", parts["rewards"])
        learner_rows = _alert_wait(timing_rows(learner, schema.LEARNER, self.state.parents))
        collector_rows = timing_rows(collector, schema.COLLECTOR, self.state.parents)
        reported = [] if collector.get("n") else ema_rows(self.state.scalar_means())
        if reported:  # its own per-step averages: in ms, no shares
            collector_rows = reported
        gpus = sum(1 for k, _ in parts["system"] if k.startswith("GPU")) * self.machines  # the job's: machines of one size
        ranks = [f"{learner['ranks']} ranks"] if learner.get("ranks") else []
        title = " · ".join(["otel-rl", self.run_id, *self.progress_parts(), _window_words(learner, self.state.iteration_under_way()), *ranks, f"GPUs {gpus}"])
        if short:
            timing = self._timing_table(
                "Timing", learner_rows + [("Collector", "", "")] + [("  " + r[0], r[1], r[2]) for r in collector_rows]
            )
            body = Group(metrics, rewards, timing)
        else:
            top = Table.grid(padding=(0, 4))
            top.add_row(metrics, rewards)
            timings = Table.grid(padding=(0, 4))
            columns = [
                self._timing_table("Learner" if width < 120 else "Learner (Iter Wall)", learner_rows),
                self._timing_table("Collector (EMA)" if reported else "Collector" if width < 120 else "Collector (own clock)", collector_rows),
            ]
            if width >= 120:
                columns.append(self._kv_table("System", parts["system"]))
            timings.add_row(*columns)
            body = Group(top, timings)
        if self.state.bottleneck:
            body = Group(body, Text("Bottleneck: " + self.state.bottleneck, style="bold"))
        status = self.state.status_line()
        return Panel(body, title=title, title_align="left", subtitle=None if status is None else Text(status, style=_status_style(status)), subtitle_align="left")

    def progress_parts(self) -> list[str]:
        """Elapsed time, env steps (of the total, when known) and the ETA; "waiting for the first iteration" before any.

        A loop that gives no env steps shows its latest iteration instead (the one under way, when it has run for
        longer than the window).
        """
        progress = self.state.progress()
        parts = [] if progress["elapsed_s"] is None else [_duration(progress["elapsed_s"])]
        steps, total = progress["env_steps"], progress["total_steps"]
        if steps is None:
            under_way = self.state.iteration_under_way()
            iteration = self.state.iteration if under_way is None else under_way[0]
            return [*parts, "waiting for the first iteration" if iteration is None else f"iteration {iteration:,}"]
        if total:
            parts.append(f"{_fmt(steps)}/{_fmt(total)} steps ({100 * min(steps / total, 1):.0f}%)")
            if progress["eta_s"] is not None:
                parts.append(f"ETA {_duration(progress['eta_s'])}")
        else:
            parts.append(f"{_fmt(steps)} steps")
        return parts

    def plain_line(self) -> str:
        learner = self.state.timing(schema.LEARNER)
        means = self.state.scalar_means()
        parts = [f"otel-rl {self.run_id}", *self.progress_parts()]
        if learner.get("n"):
            parts.append(f"iter {learner['wall_ms']:.2f} ms (n={learner['n']})")
            shares = sorted(learner["top"].items(), key=lambda kv: -kv[1])[:3]
            parts.append(", ".join(f"{_title(schema.LEARNER, k)} {100 * v / learner['wall_ms']:.0f}%" for k, v in shares))
        under_way = _under_way_words(self.state.iteration_under_way())
        if under_way:
            parts.append(under_way)
        fps = means.get("Perf/total_fps", self.state.steps_per_s() if self.state.derive_fps else None)
        if fps is not None:
            parts.append(f"{fps:.0f} steps/s")
        if "Train/mean_reward" in means:
            parts.append(f"reward {means['Train/mean_reward']:.1f}")
        if self.state.bottleneck:
            parts.append("bottleneck: " + self.state.bottleneck)
        status = self.state.status_line()
        if status is not None:
            parts.append(status)
        return " | ".join(parts)


class PanelSink(RecordSink):
    """Feeds the panel from the pipeline; a :class:`PanelPainter` redraws it on its own thread."""

    def __init__(self, run_id: str, console: Console | None = None, derive_fps: bool = True, machines: int = 1) -> None:
        """``derive_fps``: show Steps/s from the env steps when the loop does not log ``Perf/total_fps`` (a run of one rank);
        ``machines``: the job's machines (its GPUs are this machine's times them)."""
        self.state = PanelState(derive_fps=derive_fps)
        self.num_envs: int | None = None
        self.view = PanelView(self.state, run_id, lambda: self.num_envs, machines)
        self.console = console or Console(file=terminal.terminal_file(sys.stdout))  # a stalled terminal holds no thread
        self._painter = PanelPainter(self.view, self.console)

    def on_run_start(self, run: RunStart) -> None:
        self.num_envs = run.num_envs
        self.state.total_steps = run.total_steps if run.total_steps else None
        self.state.started_ns = run.start_ns

    def on_cycles(self, totals: PassTotals) -> None:
        self.state.add_pass(totals)

    def on_scalars(self, batch: ScalarBatch) -> None:
        self.state.add_scalars(batch)

    def on_event(self, event: EventRecord) -> None:
        if event.name == schema.EVENT_WARMUP_DONE:
            self.state.warmed_up = True
        elif event.name == schema.EVENT_BOTTLENECK:
            text, caveat = event.attributes.get("text"), event.attributes.get("caveat")
            self.state.bottleneck = f"{text} ({caveat})" if caveat else str(text or "") or None
        elif event.name == STATUS_EVENT:
            text = str(event.attributes.get("text", ""))
            self.state.status = text or None
            if _says_error(text):
                self._painter.wake()  # an error is shown now, not at the next redraw

    def on_notice(self, text: str) -> None:
        # Said here, above the panel, rather than by the training process over it (a line between two frames garbles both).
        self._painter.note(text)

    def shutdown(self, deadline: Deadline) -> None:
        self._painter.shutdown(deadline)


class PanelPainter(BackgroundLoop):
    """Draws the view at :data:`REFRESH_HZ` on a terminal (within :data:`MAX_DUTY` of a core), else a plain line every :data:`PLAIN_EVERY_S`."""

    def __init__(self, view: PanelView, console: Console) -> None:
        terminal = console.is_terminal and not console.is_dumb_terminal  # TERM=dumb (an Emacs shell, CI consoles): plain lines
        super().__init__("otel-rl-panel", 1.0 / REFRESH_HZ if terminal else PLAIN_EVERY_S)
        self._view = view
        self._console = console
        self._notes: deque[str] = deque(maxlen=256)
        self._said: set[str] = set()
        self._live: Live | None = None
        if terminal:
            # Never take over the training script's stdout and stderr: its prints go where they always went.
            self._live = Live(console=console, auto_refresh=False, transient=False, redirect_stdout=False, redirect_stderr=False)
            self._live.start()
            self._live.update(view.render(console.width), refresh=True)  # a frame at once, before the first iteration
        self.start()

    def note(self, line: str) -> None:
        """A line to print above the panel (once per text), by the painter's thread: a blocked terminal holds no other."""
        if line in self._said:
            return
        if len(self._said) < 1024:
            self._said.add(line)
        self._notes.append(line)
        self.wake()

    def _print_notes(self) -> None:
        while self._notes:
            self._console.print(self._notes.popleft(), highlight=False, soft_wrap=True, markup=False)  # above a live panel

    def run_once(self) -> None:
        self._print_notes()
        if self.stopping:
            return
        if self._live is None:
            self._console.print(self._view.plain_line(), highlight=False, soft_wrap=True)
            return
        started = time.thread_time()
        self._live.update(self._view.render(self._console.width), refresh=True)
        # Redrawing holds the GIL (~20 ms for a wide panel on a slow core): keep it under MAX_DUTY.
        self.interval_s = max(1.0 / REFRESH_HZ, (time.thread_time() - started) / MAX_DUTY)

    def release(self) -> None:
        self._print_notes()
        if self._live is not None:
            self._live.update(self._view.render(self._console.width), refresh=True)
            self._live.stop()


class CommitTable(RecordSink):
    """Seed 002's ``tabulate_stats``: each committed set of stats (``otel_rl.stats_tracker.commit``) printed as a
    table headed by its epoch and steps, for a run whose standard output shows no panel (a batch job's log).

    A commit's table holds its own values (recorded just before it) and, from the second commit on, every key's
    latest value as of the commit. Nothing is kept or drawn until a first commit; tables are printed by a thread of their own (a blocked
    standard output holds that thread only), at most :data:`COMMITS_KEPT` waiting, the oldest giving way.
    """

    COMMITS_KEPT = 8

    def __init__(self, console: Console | None = None) -> None:
        self.latest: dict[str, Any] = {}
        self._commits: deque[tuple[dict[str, Any], dict[str, Any]]] = deque(maxlen=self.COMMITS_KEPT)
        self._pending: list[tuple[int, dict[str, Any]]] = []  # this pass's commits (a pass hands over its events first)
        self._batches: list[ScalarBatch] = []  # this pass's scalars, kept only while a commit waits for them
        self._console = console
        self._printer: _TablePrinter | None = None

    def on_event(self, event: EventRecord) -> None:
        if event.name == schema.EVENT_COMMIT:
            self._pending.append((event.time_ns, dict(event.attributes)))

    def on_scalars(self, batch: ScalarBatch) -> None:
        if self._pending:
            self._batches.append(batch)
        elif self._printer is not None:  # a run that never commits pays nothing here
            self.latest.update(batch.latest_values())

    def on_drain(self, now_ns: int) -> None:
        if not self._pending:
            return
        records = sorted((record for batch in self._batches for record in batch), key=lambda record: record.time_ns)
        at = 0
        for time_ns, header in sorted(self._pending, key=lambda commit: commit[0]):
            while at < len(records) and records[at].time_ns <= time_ns:
                self.latest.update(records[at].values)
                at += 1
            self._commits.append((header, dict(self.latest)))
        for record in records[at:]:
            self.latest.update(record.values)
        self._pending, self._batches = [], []
        if self._printer is None:
            self._printer = _TablePrinter(self._commits, self._console or Console(file=terminal.terminal_file(sys.stdout), highlight=False))
        self._printer.wake()

    def shutdown(self, deadline: Deadline) -> None:
        if self._pending:
            self.on_drain(0)
        if self._printer is not None:
            self._printer.shutdown(deadline)


def commit_header(header: dict[str, Any]) -> str:
    """``otel-rl stats · Epoch 1 · Epoch step 3 · Global step 41``: the commit's place, as given."""
    parts = [f"{name.replace('_', ' ').capitalize()} {header[name]}" for name in ("epoch", "epoch_step", "global_step") if header.get(name) is not None]
    return " · ".join(["otel-rl stats", *parts])


def commit_table(values: dict[str, Any]) -> Table:
    """``values`` as a two-column table: key, value."""
    table = Table(box=None, pad_edge=False)
    table.add_column("key", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    for key in sorted(values):
        value = values[key]
        table.add_row(key, "nan" if value is None else _fmt(value) if isinstance(value, (int, float)) else str(value))
    return table


class _TablePrinter(BackgroundLoop):
    def __init__(self, commits: deque, console: Console) -> None:
        super().__init__("otel-rl-commit-table", 1.0)
        self._commits, self._console = commits, console
        self.start()

    def has_work(self) -> bool:
        return bool(self._commits)

    def run_once(self) -> None:
        while self._commits:
            header, values = self._commits.popleft()
            self._console.print(commit_header(header), soft_wrap=True)
            self._console.print(commit_table(values))

