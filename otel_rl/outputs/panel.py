"""The live terminal panel: what the training is doing, redrawn at 2 Hz by its own thread.

It reads the pipeline's records (a :class:`~otel_rl.core.pipeline.RecordSink`) into
bounded windows and shows 2-second averages ("Avg 2s (n=...)"): the backends
keep the unsmoothed per-iteration values. The training loop never triggers a
redraw. Width tiers: under 96 columns everything stacks with a single Timing
column; from 96 metrics and rewards sit side by side with Learner and
Collector timing; from 120 a System column joins. When stdout is not a
terminal, a plain line is printed every few seconds instead.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from otel_rl.base.deadline import Deadline
from otel_rl.base.loops import BackgroundLoop
from otel_rl.core.batches import ScalarBatch
from otel_rl.core.pipeline import RecordSink
from otel_rl.core.records import RunStart
from otel_rl.core.totals import PassTotals
from otel_rl.formats import schema

WINDOW_S = 2.0
REFRESH_HZ = 2.0
MAX_DUTY = 0.01
"""Share of a core the panel may spend redrawing; a slow terminal or a busy machine redraws less often."""
PLAIN_EVERY_S = 5.0
QUIET_SHARE = 0.01
"""Nested and diagnostic collector rows below this share of the cycle are not shown."""


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

    def add_pass(self, totals: PassTotals) -> None:
        """The cycles of one pipeline pass, local and relayed from workers; nanoseconds are kept, rendering converts."""
        steps = None
        for timeline, cycles in totals.timelines.items():
            if cycles.cycles:
                target = self.learner if timeline == schema.LEARNER else self.collector
                target.add(totals.time_ns, {"wall": cycles.wall_ns}, cycles.top, cycles.nested, records=cycles.cycles)
            if cycles.env_steps is not None and (steps is None or cycles.env_steps > steps):
                steps = cycles.env_steps
            if cycles.index is not None and (timeline == schema.LEARNER or schema.LEARNER not in totals.timelines):
                self.iteration = cycles.index
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
        self.latest.update(batch.latest_values())
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

    def timing(self, timeline: str) -> dict[str, Any]:
        """Window means per cycle: cycle wall, top-level and nested phase ms, and n."""
        n, (wall, top, nested), _ = (self.learner if timeline == schema.LEARNER else self.collector).read(self._clock())
        if not n:
            return {"n": 0}
        return {
            "n": n,
            "wall_ms": wall.get("wall", 0) / n / 1e6,
            "top": {k: v / n / 1e6 for k, v in top.items()},
            "nested": {k: v / n / 1e6 for k, v in nested.items()},
        }

    def scalar_means(self) -> dict[str, float]:
        _, (sums,), (counts,) = self.scalars.read(self._clock())
        means = {k: sums[k] / counts[k] for k in sums}
        for key, value in self.latest.items():
            if value is not None:
                means.setdefault(key, value)  # keys not updated in the window keep their last value
        return means


def _title(timeline: str, name: str) -> str:
    spec = schema.PHASES.get((timeline, name))
    return spec.title if spec else name.replace("_", " ").title()


def timing_rows(timing: dict[str, Any], timeline: str) -> list[tuple[str, str, str]]:
    """(label, ms, share) rows; top-level rows and Other add up to exactly 100%."""
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
    for (name, ms), share in zip(top, shares, strict=False):
        rows.append((_title(timeline, name), f"{ms:.2f}", f"{share:.1f}%"))
        for child, child_ms in timing["nested"].items():
            spec = schema.PHASES.get((timeline, child))
            if spec and spec.parent == name and (timeline == schema.LEARNER or child_ms / wall >= QUIET_SHARE):
                rows.append(("  " + spec.title, f"{child_ms:.2f}", f"{100 * child_ms / wall:.1f}%"))
    if timeline == schema.LEARNER or other / wall >= QUIET_SHARE:
        rows.append(("Other", f"{other:.2f}", f"{shares[-1]:.1f}%"))
    return rows


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

    def __init__(self, state: PanelState, run_id: str, num_envs: Callable[[], int | None] = lambda: None) -> None:
        self.state = state
        self.run_id = run_id
        self._num_envs = num_envs

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
        metrics = [("Steps/s" if short else "Steps/s (Perf/total_fps)", _fmt(means["Perf/total_fps"]))] if "Perf/total_fps" in means else []
        derived = None if metrics or not self.state.derive_fps else self.state.steps_per_s()
        if derived is not None:  # the loop logs none: from its env steps and the time
            metrics = [("Steps/s", _fmt(derived))]
        distributions = {key.removesuffix("/mean") for key in means if key.endswith("/mean") and f"{key[:-5]}/std" in means}
        for key in sorted(means):
            base = key.rsplit("/", 1)[0]
            if base in distributions:  # a distribution's statistics: one row, its mean and spread
                if key.endswith("/mean"):
                    label = base.split("/", 1)[1] if short else base
                    metrics.append((label, f"{_fmt(means[key])} ± {_fmt(means[base + '/std'])}"))
                continue
            if key.startswith(("Loss/", "Policy/")) or key == "Train/mean_episode_length":
                metrics.append((key.split("/", 1)[1] if short else key, _fmt(means[key])))
        rewards = []
        if "Train/mean_reward" in means:
            rewards.append(("Mean reward" if short else "Train/mean_reward", f"{means['Train/mean_reward']:.1f}" if short else f"{means['Train/mean_reward']:.3f}"))
        for key in sorted(k for k in means if k.startswith("reward/")):
            rewards.append((key.split("/", 1)[1] if short else key, f"{means[key]:.3g}"))
        system = [
            ("Envs", str(self._num_envs() or "-")),
            ("Buffer", _fmt(means["Train/buffer_size"]) if "Train/buffer_size" in means else "-"),
            ("CPU", f"{means.get('sys/process_cpu_percent', 0):.0f}%"),
            ("RSS", _fmt(means.get("sys/process_rss_bytes", 0)) + "B"),
        ]
        for key in sorted(k for k in means if k.startswith("sys/gpu") and k.endswith("_util_percent")):
            system.append((key.removeprefix("sys/").removesuffix("_util_percent").upper(), f"{means[key]:.0f}%"))
        return {"metrics": metrics, "rewards": rewards, "system": system}

    def render(self, width: int):
        learner = self.state.timing(schema.LEARNER)
        collector = self.state.timing(schema.COLLECTOR)
        short = width < 96
        parts = self.sections(short)
        metrics = self._kv_table("Metrics", parts["metrics"])
        rewards = self._kv_table("Rewards", parts["rewards"])
        learner_rows = timing_rows(learner, schema.LEARNER)
        collector_rows = timing_rows(collector, schema.COLLECTOR)
        gpus = sum(1 for k, _ in parts["system"] if k.startswith("GPU"))
        title = " · ".join(["otel-rl", self.run_id, *self.progress_parts(), f"Avg {WINDOW_S:.0f}s (n={learner.get('n', 0)})", f"GPUs {gpus}"])
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
                self._timing_table("Collector" if width < 120 else "Collector (own clock)", collector_rows),
            ]
            if width >= 120:
                columns.append(self._kv_table("System", parts["system"]))
            timings.add_row(*columns)
            body = Group(top, timings)
        return Panel(body, title=title, title_align="left")

    def progress_parts(self) -> list[str]:
        """Elapsed time, env steps (of the total, when known) and the ETA; "waiting for the first iteration" before any.

        A loop that gives no env steps shows its latest iteration instead.
        """
        progress = self.state.progress()
        parts = [] if progress["elapsed_s"] is None else [_duration(progress["elapsed_s"])]
        steps, total = progress["env_steps"], progress["total_steps"]
        if steps is None:
            iteration = self.state.iteration
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
        fps = means.get("Perf/total_fps", self.state.steps_per_s() if self.state.derive_fps else None)
        if fps is not None:
            parts.append(f"{fps:.0f} steps/s")
        if "Train/mean_reward" in means:
            parts.append(f"reward {means['Train/mean_reward']:.1f}")
        return " | ".join(parts)


class PanelSink(RecordSink):
    """Feeds the panel from the pipeline; a :class:`PanelPainter` redraws it on its own thread."""

    def __init__(self, run_id: str, console: Console | None = None, derive_fps: bool = True) -> None:
        """``derive_fps``: show Steps/s from the env steps when the loop does not log ``Perf/total_fps`` (a run of one rank)."""
        self.state = PanelState(derive_fps=derive_fps)
        self.num_envs: int | None = None
        self.view = PanelView(self.state, run_id, lambda: self.num_envs)
        self.console = console or Console()
        self._painter = PanelPainter(self.view, self.console)

    def on_run_start(self, run: RunStart) -> None:
        self.num_envs = run.num_envs
        self.state.total_steps = run.total_steps if run.total_steps else None
        self.state.started_ns = run.start_ns

    def on_cycles(self, totals: PassTotals) -> None:
        self.state.add_pass(totals)

    def on_scalars(self, batch: ScalarBatch) -> None:
        self.state.add_scalars(batch)

    def shutdown(self, deadline: Deadline) -> None:
        self._painter.shutdown(deadline)


class PanelPainter(BackgroundLoop):
    """Draws the view at :data:`REFRESH_HZ` on a terminal (within :data:`MAX_DUTY` of a core), else a plain line every :data:`PLAIN_EVERY_S`."""

    def __init__(self, view: PanelView, console: Console) -> None:
        terminal = console.is_terminal and not console.is_dumb_terminal  # TERM=dumb (an Emacs shell, CI consoles): plain lines
        super().__init__("otel-rl-panel", 1.0 / REFRESH_HZ if terminal else PLAIN_EVERY_S)
        self._view = view
        self._console = console
        self._live: Live | None = None
        if terminal:
            # Never take over the training script's stdout and stderr: its prints go where they always went.
            self._live = Live(console=console, auto_refresh=False, transient=False, redirect_stdout=False, redirect_stderr=False)
            self._live.start()
            self._live.update(view.render(console.width), refresh=True)  # a frame at once, before the first iteration
        self.start()

    def run_once(self) -> None:
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
        if self._live is not None:
            self._live.update(self._view.render(self._console.width), refresh=True)
            self._live.stop()
