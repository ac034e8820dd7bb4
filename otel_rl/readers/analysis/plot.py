"""``otel-rl analyze --plot FILE.png``: the timeline and the phase shares, drawn with matplotlib."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from otel_rl.readers.analysis.measure import phase_name
from otel_rl.formats.report import Report
from otel_rl.readers.analysis.trace_model import Slice, TraceModel

WINDOW_CYCLES = 8
"""The timeline panel shows the last few learner iterations, where detail is readable."""


def timeline_rows(slices: list[Slice]) -> dict[tuple[str, str, str], list[Slice]]:
    """The timeline panel's rows, learner first: one per (timeline, thread track, process), holding that row's own slices.

    A thread that collects and learns in turn has a row per timeline.
    """
    rows: dict[tuple[str, str, str], list[Slice]] = {}
    for s in slices:
        rows.setdefault((s.category, s.track, s.process), []).append(s)
    return dict(sorted(rows.items(), key=lambda row: ("learner", "collector", "gpu").index(row[0][0])))


def plot(model: TraceModel, report: Report, path: Path | str) -> None:
    """Draw the figure (:func:`figure`) to ``path``."""
    import matplotlib.pyplot as plt

    fig = figure(model, report)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(model: TraceModel, report: Report) -> Any:
    """The timeline of the last learner iterations and each timeline's phase shares, as a matplotlib figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    slices = [s for s in model.slices if s.category in ("learner", "collector", "gpu")]
    iterations = sorted((s for s in slices if s.name == "learner iteration"), key=lambda s: s.start_ns)
    if iterations:
        window = iterations[-WINDOW_CYCLES:]
        t0, t1 = window[0].start_ns, window[-1].end_ns
    else:
        t0 = min((s.start_ns for s in slices), default=0)
        t1 = max((s.end_ns for s in slices), default=1)
    shown = [s for s in slices if s.end_ns > t0 and s.start_ns < t1 and not s.name.endswith(" iteration")]
    tracks = timeline_rows(shown)
    names = sorted({s.name for s in shown})
    cmap = plt.get_cmap("tab20")
    colors = {name: cmap(i % 20) for i, name in enumerate(names)}

    fig, (timeline, shares) = plt.subplots(2, 1, figsize=(13, 3 + 0.6 * len(tracks) + 2), height_ratios=[max(len(tracks), 1), 2])
    def nested(s) -> bool:
        return s.parent != -1 and not model.slices[s.parent].name.endswith(" iteration")

    for row, ((category, track, process), own) in enumerate(tracks.items()):
        # Top-level phases first, nested ones drawn over their lower half.
        for s in sorted(own, key=nested):
            height, offset = (0.4, 0.0) if nested(s) else (0.8, -0.4)
            timeline.broken_barh(
                [((s.start_ns - t0) / 1e6, s.duration_ns / 1e6)], (row + offset, height), color=colors[s.name]
            )
    timeline.set_yticks(range(len(tracks)), [f"{p} process · {c}" if p else track for c, track, p in tracks])
    timeline.set_xlabel("ms")
    timeline.set_title("timeline (last learner iterations)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[n]) for n in names]
    timeline.legend(handles, names, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)

    rows = []
    for timeline_name, entry in report.timelines.items():
        top = [(n, v) for n, v in entry.phases.items() if not v.nested]
        rows.append((timeline_name, top, entry.other_share))
    labels = []
    for y, (timeline_name, top, other) in enumerate(rows):
        left = 0.0
        for name, stat in top:
            title = stat.title
            width = 100 * stat.share
            shares.barh(y, width, left=left, color=colors.get(title, cmap(hash(phase_name(timeline_name, title)) % 20)))
            labels.append((shares.text(left + width / 2, y, title, ha="center", va="center", fontsize=8), left, width))
            left += width
        if other > 0:
            shares.barh(y, 100 * other, left=left, color="lightgrey")
    shares.set_yticks(range(len(rows)), [r[0] for r in rows])
    shares.set_xlabel("% of cycle")
    shares.set_xlim(0, 100)
    shares.set_title(f"phase shares — bottleneck: {report.diagnosis.bottleneck if report.diagnosis else ''}")
    fig.tight_layout()
    _keep_labels_that_fit(fig, shares, labels)
    return fig


def _keep_labels_that_fit(fig: Any, axes: Any, labels: list[tuple[Any, float, float]]) -> None:
    """Remove each bar's label that is wider than its bar (the legend names its colour): labels never overlap."""
    renderer = fig.canvas.get_renderer()
    for text, left, width in labels:
        bar_px = axes.transData.transform((left + width, 0))[0] - axes.transData.transform((left, 0))[0]
        if text.get_window_extent(renderer).width > 0.95 * bar_px:
            text.remove()
