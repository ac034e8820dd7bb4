"""Grafana dashboards as code (grafana-foundation-sdk); writes the JSON next to this file.

    python dashboards/generate.py          # rewrite the JSON files
    python dashboards/generate.py --check  # fail if the committed JSON is stale

Metric names are the Prometheus names of what the otel-rl pipeline exports
(through collector-config/otelcol.yaml): ``rl.phase.duration`` in ms becomes
``rl_phase_duration_milliseconds_*``, attribute ``rl.phase`` becomes label
``rl_phase``. Phase names come from otel_rl.formats.schema, never spelled here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, statetimeline, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import StackingMode
from grafana_foundation_sdk.models.dashboard import DataSourceRef, GridPos, ValueMap, ValueMappingResult

from otel_rl.formats import schema

HERE = Path(__file__).parent
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
SELECTOR = 'service_name=~"$service", rl_run_id=~"$run_id"'
RATE = "$__rate_interval"
ENV_STEPS = f"max by (rl_run_id) (rl_env_steps_total{{{SELECTOR}}})"
"""Env steps of each run, once: the learner and the collectors all report the job's cumulative count."""
NESTED = "|".join(sorted(p.name for p in schema.PHASES.values() if p.parent is not None))


def _iteration_rate(timeline: str) -> str:
    return f'sum(rate(rl_iteration_duration_milliseconds_count{{rl_timeline="{timeline}", {SELECTOR}}}[{RATE}]))'


def _per_iteration(timeline: str) -> str:
    """Milliseconds per cycle of each top-level phase (stacked, they add up to Iter Wall minus Other)."""
    phases = f'rate(rl_phase_duration_milliseconds_sum{{rl_timeline="{timeline}", rl_clock="host", rl_phase!~"{NESTED}", {SELECTOR}}}[{RATE}])'
    return f"sum by (rl_phase) ({phases}) / scalar({_iteration_rate(timeline)})"


def _query(expr: str, legend: str, ref: str = "A") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)


def _timeseries(title: str, unit: str, queries: list[prometheus.Dataquery], grid: GridPos, description: str, stacked: bool = False):
    panel = timeseries.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE).grid_pos(grid)
    for query in queries:
        panel = panel.with_target(query)
    if stacked:
        panel = panel.stacking(_stacking()).fill_opacity(60)
    return panel


def _stacking():
    from grafana_foundation_sdk.builders.common import StackingConfig

    return StackingConfig().mode(StackingMode.NORMAL)


def _stat(title: str, unit: str, expr: str, grid: GridPos, description: str):
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .grid_pos(grid)
        .with_target(_query(expr, title).instant())
    )


def _base(uid: str, title: str, description: str) -> dashboard.Dashboard:
    runs = 'label_values(rl_iteration_duration_milliseconds_count{service_name=~"$service"}, rl_run_id)'
    return (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["otel-rl", "reinforcement-learning"])
        .refresh("10s")
        .time("now-30m", "now")
        .with_variable(dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(
            dashboard.QueryVariable("service")
            .label("Service")
            .datasource(DATASOURCE)
            .query("label_values(rl_iteration_duration_milliseconds_count, service_name)")
            .include_all(True)
            .all_value(".*")
            .multi(True)
        )
        .with_variable(
            dashboard.QueryVariable("run_id")
            .label("Run")
            .datasource(DATASOURCE)
            .query(runs)
            .include_all(True)
            .all_value(".*")
            .multi(True)
        )
    )


def overview() -> dashboard.Dashboard:
    return (
        _base("otel-rl-overview", "RL training overview", "Is the run alive, how fast is it, is it learning?")
        .with_panel(
            _stat(
                "Learner iterations per second",
                "short",
                _iteration_rate(schema.LEARNER),
                GridPos(h=4, w=4, x=0, y=0),
                "Run status at a glance: 0 means the learner stopped.",
            )
        )
        .with_panel(
            _stat(
                "Run",
                "none",
                f"max(rl_run_active{{{SELECTOR}}})",
                GridPos(h=4, w=4, x=4, y=0),
                "Running, or ended (finished, failed or killed: the run summary and the ingest server say which).",
            ).mappings([ValueMap({"1": ValueMappingResult(text="running", color="green"), "0": ValueMappingResult(text="ended", color="blue")})])
        )
        .with_panel(
            _stat(
                "Seconds since the last report",
                "s",
                f"(time() - max(timestamp(rl_iteration_duration_milliseconds_count{{{SELECTOR}}})))"
                f" and on() (max(rl_run_active{{{SELECTOR}}}) == 1)",
                GridPos(h=4, w=4, x=8, y=0),
                "While the run is open. Growing: it stopped reporting (stuck or dead). Empty once the run ended.",
            )
        )
        .with_panel(
            _stat(
                "Telemetry records dropped",
                "short",
                f'sum(rl_telemetry_dropped_total{{{SELECTOR}, rl_telemetry_queue!="span_budget"}}) or vector(0)',
                GridPos(h=4, w=4, x=12, y=0),
                "Records lost by a bounded queue that was full or an output that failed; training never waits for telemetry.",
            )
        )
        .with_panel(
            _stat(
                "Spans sampled out",
                "short",
                f'sum(rl_telemetry_dropped_total{{{SELECTOR}, rl_telemetry_queue="span_budget"}}) or vector(0)',
                GridPos(h=4, w=4, x=16, y=0),
                "Iterations left out of OTLP traces by the span budget (span_budget_per_s), by design: their metrics, "
                "the Perfetto trace and metrics.jsonl have them all.",
            )
        )
        .with_panel(
            _stat(
                "Env steps",
                "short",
                f"sum({ENV_STEPS})",
                GridPos(h=4, w=4, x=20, y=0),
                "Environment steps taken so far (each run counted once, however many processes report it).",
            )
        )
        .with_panel(
            _timeseries(
                "Throughput (Perf/total_fps)",
                "suffix: steps/s",
                [
                    _query(f"rl_perf_total_fps_per_second{{{SELECTOR}}}", "{{rl_run_id}} reported", "A"),
                    _query(f"max by (rl_run_id) (rate(rl_env_steps_total{{{SELECTOR}}}[{RATE}]))", "{{rl_run_id}} from env steps", "B"),
                ],
                GridPos(h=8, w=12, x=0, y=4),
                "Environment steps per second of the whole job (summed over collectors and ranks).",
            )
        )
        .with_panel(
            _timeseries(
                "Mean reward (last 100 episodes)",
                "none",
                [_query(f"rl_train_mean_reward{{{SELECTOR}}}", "{{rl_run_id}}")],
                GridPos(h=8, w=12, x=12, y=4),
                "Train/mean_reward: is the agent learning?",
            )
        )
        .with_panel(
            _timeseries(
                "Episode length",
                "none",
                [_query(f"rl_train_mean_episode_length{{{SELECTOR}}}", "{{rl_run_id}}")],
                GridPos(h=8, w=12, x=0, y=12),
                "Train/mean_episode_length over the last 100 episodes.",
            )
        )
        .with_panel(
            _timeseries(
                "Losses",
                "none",
                [_query(f'{{__name__=~"rl_loss_.+", {SELECTOR}}}', "{{__name__}} {{rl_run_id}}")],
                GridPos(h=8, w=12, x=12, y=12),
                "Every Loss/* scalar (rl_loss_*).",
            )
        )
    )


def timelines() -> dashboard.Dashboard:
    def phase_quantile(q: str) -> str:
        buckets = f'rate(rl_phase_duration_milliseconds_bucket{{rl_clock="host", {SELECTOR}}}[{RATE}])'
        return f"histogram_quantile({q}, sum by (le, rl_timeline, rl_phase) ({buckets}))"

    learner_other = (
        f'sum(rate(rl_iteration_duration_milliseconds_sum{{rl_timeline="learner", {SELECTOR}}}[{RATE}])) / {_iteration_rate("learner")}'
        f' - sum({_per_iteration("learner")})'
    )
    return (
        _base(
            "otel-rl-timelines",
            "Learner and collector timelines",
            "Where each iteration's time goes, on the learner and on the collector's own clock.",
        )
        .with_panel(
            _timeseries(
                "Learner time per iteration, by phase",
                "ms",
                [_query(_per_iteration(schema.LEARNER), "{{rl_phase}}")],
                GridPos(h=9, w=12, x=0, y=0),
                "Top-level learner phases stacked: their sum plus Other is Iter Wall. Nested phases are not counted again.",
                stacked=True,
            )
        )
        .with_panel(
            _timeseries(
                "Collector time per cycle, by phase",
                "ms",
                [_query(_per_iteration(schema.COLLECTOR), "{{rl_phase}}")],
                GridPos(h=9, w=12, x=12, y=0),
                "The collector's own cycle, stacked. Learner Action Wait high with a low learner Collector Wait: the learner is the bottleneck.",
                stacked=True,
            )
        )
        .with_panel(
            _timeseries(
                "Other (learner time in no phase)",
                "ms",
                [_query(learner_other, "Other")],
                GridPos(h=8, w=8, x=0, y=9),
                "Iter Wall minus the top-level phases: bookkeeping nobody instrumented.",
            )
        )
        .with_panel(
            _timeseries(
                "Phase p50",
                "ms",
                [_query(phase_quantile("0.5"), "{{rl_timeline}} {{rl_phase}}")],
                GridPos(h=8, w=8, x=8, y=9),
                "Median duration of each phase, from the rl.phase.duration histograms.",
            )
        )
        .with_panel(
            _timeseries(
                "Phase p95",
                "ms",
                [_query(phase_quantile("0.95"), "{{rl_timeline}} {{rl_phase}}")],
                GridPos(h=8, w=8, x=16, y=9),
                "95th percentile of each phase: spikes that the mean hides.",
            )
        )
        .with_panel(
            _timeseries(
                "Busy share (not waiting for the other side)",
                "percentunit",
                [
                    _query(
                        f'1 - sum(rate(rl_phase_duration_milliseconds_sum{{rl_timeline="learner", rl_phase="collector_wait", {SELECTOR}}}[{RATE}]))'
                        f' / sum(rate(rl_iteration_duration_milliseconds_sum{{rl_timeline="learner", {SELECTOR}}}[{RATE}]))',
                        "learner",
                        "A",
                    ),
                    _query(
                        f'1 - sum(rate(rl_phase_duration_milliseconds_sum{{rl_timeline="collector", rl_phase="learner_action_wait", {SELECTOR}}}[{RATE}]))'
                        f' / sum(rate(rl_iteration_duration_milliseconds_sum{{rl_timeline="collector", {SELECTOR}}}[{RATE}]))',
                        "collector",
                        "B",
                    ),
                ],
                GridPos(h=8, w=12, x=0, y=17),
                "How much of its cycle each side works. Both high: they overlap well. The Perfetto trace shows the overlap exactly.",
            )
        )
        .with_panel(
            _timeseries(
                "Spans exported per second, by phase",
                "short",
                [_query(f"sum by (rl_phase) (rate(traces_span_metrics_calls_total{{{SELECTOR}}}[{RATE}]))", "{{rl_phase}}")],
                GridPos(h=8, w=12, x=12, y=17),
                "From the collector's spanmetrics connector: what the span budget lets through.",
            )
        )
        .with_panel(
            statetimeline.Panel()
            .title("Bottleneck (live verdict)")
            .description(
                "Each run's live verdict over time: the side and phase that set its pace, as otel-rl analyze's rules read the last"
                " seconds of the run (rl.bottleneck). A change of colour is a change of bottleneck; the throughput panel beside it"
                " says what it cost."
            )
            .unit("none")
            .datasource(DATASOURCE)
            .grid_pos(GridPos(h=6, w=24, x=0, y=25))
            .with_target(_query(f"max by (rl_run_id, rl_timeline, rl_phase) ({_metric(schema.METRIC_BOTTLENECK)}{{{SELECTOR}}}) == 1",
                                "{{rl_run_id}}: {{rl_timeline}} ({{rl_phase}})"))
        )
    )


def _metric(name: str) -> str:
    """A metric's Prometheus name, as the collector's exporter writes it."""
    return name.replace(".", "_")


GPU_METRICS = ("gpu_utilization_ratio", "gpu_memory_usage_bytes", "gpu_power_watts", "gpu_temperature_celsius")
"""Produced only where NVML finds a GPU (see otel_rl.core.system_metrics)."""


def system() -> dashboard.Dashboard:
    return (
        _base("otel-rl-system", "System", "CPU, memory and GPU of the training processes and hosts.")
        .with_panel(
            _timeseries(
                "Process CPU",
                "percentunit",
                [_query(f"process_cpu_utilization_ratio{{{SELECTOR}}}", "{{rl_role}} {{rl_run_id}}")],
                GridPos(h=8, w=12, x=0, y=0),
                "CPU of each training process (1.0 is one core).",
            )
        )
        .with_panel(
            _timeseries(
                "Process memory (RSS)",
                "bytes",
                [_query(f"process_memory_usage_bytes{{{SELECTOR}}}", "{{rl_role}} {{rl_run_id}}")],
                GridPos(h=8, w=12, x=12, y=0),
                "Resident memory of each training process.",
            )
        )
        .with_panel(
            _timeseries(
                "Host CPU and memory",
                "percentunit",
                [_query(f"system_cpu_utilization_ratio{{{SELECTOR}}}", "CPU {{rl_role}}")],
                GridPos(h=8, w=12, x=0, y=8),
                "The whole machine's CPU utilization.",
            )
        )
        .with_panel(
            _timeseries(
                "Host memory used",
                "bytes",
                [_query(f"system_memory_usage_bytes{{{SELECTOR}}}", "{{rl_role}}")],
                GridPos(h=8, w=12, x=12, y=8),
                "Memory in use on the machine.",
            )
        )
        .with_panel(
            _timeseries(
                "GPU utilization",
                "percentunit",
                [_query(f"gpu_utilization_ratio{{{SELECTOR}}}", "GPU {{gpu_index}}")],
                GridPos(h=8, w=8, x=0, y=16),
                "NVML utilization per GPU (empty without a GPU).",
            )
        )
        .with_panel(
            _timeseries(
                "GPU memory",
                "bytes",
                [_query(f"gpu_memory_usage_bytes{{{SELECTOR}}}", "GPU {{gpu_index}}")],
                GridPos(h=8, w=8, x=8, y=16),
                "NVML memory used per GPU.",
            )
        )
        .with_panel(
            _timeseries(
                "GPU power",
                "watt",
                [_query(f"gpu_power_watts{{{SELECTOR}}}", "GPU {{gpu_index}}")],
                GridPos(h=8, w=8, x=16, y=16),
                "NVML power draw per GPU.",
            )
        )
        .with_panel(
            _timeseries(
                "Telemetry queues",
                "short",
                [_query(f"rl_telemetry_pending{{{SELECTOR}}}", "pending {{rl_telemetry_queue}}")],
                GridPos(h=8, w=12, x=0, y=24),
                "Records waiting in otel-rl's bounded queues (a healthy pipeline keeps them near zero).",
            )
        )
    )


DASHBOARDS = {"overview.json": overview, "timelines.json": timelines, "system.json": system}


def render() -> dict[str, str]:
    return {name: json.dumps(build().build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n" for name, build in DASHBOARDS.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed JSON differs")
    args = parser.parse_args()
    stale = []
    for name, text in render().items():
        path = HERE / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale dashboards (run python dashboards/generate.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
