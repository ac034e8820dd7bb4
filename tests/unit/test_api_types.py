"""The disabled twin is the same type as Telemetry: mypy holds both to :class:`otel_rl.api.TrainingTelemetry`."""

import subprocess
import sys
import textwrap


def test_telemetry_and_its_disabled_twin_are_both_the_training_api(tmp_path):
    check = tmp_path / "check_api.py"
    check.write_text(textwrap.dedent('''
        from otel_rl.api import TrainingTelemetry
        from otel_rl.telemetry import NoOpTelemetry, Telemetry

        def either(real: Telemetry, disabled: NoOpTelemetry) -> list[TrainingTelemetry]:
            return [real, disabled]
    '''))
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "--ignore-missing-imports", "--no-error-summary", str(check)],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_method_missing_from_the_twin_is_a_type_error(tmp_path):
    check = tmp_path / "check_missing.py"
    check.write_text(textwrap.dedent('''
        from otel_rl.api import TrainingTelemetry

        class Partial:
            enabled = False
            trace_id = 0

        def as_api(partial: Partial) -> TrainingTelemetry:
            return partial
    '''))
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "--ignore-missing-imports", str(check)],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 1 and "TrainingTelemetry" in result.stdout, result.stdout


def test_init_takes_every_option_as_a_typed_keyword():
    """init()'s keywords are TelemetryConfig's fields, with their types: what an IDE completes and a checker checks."""
    import dataclasses
    import inspect

    import otel_rl
    from otel_rl.config import RETIRED_OPTIONS

    signature = inspect.signature(otel_rl.init)
    keywords = {n: p for n, p in signature.parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    fields = {f.name: f.type for f in dataclasses.fields(otel_rl.TelemetryConfig)}
    assert set(keywords) | {"run_dir", "service_name"} == set(fields) | set(RETIRED_OPTIONS)
    for name, parameter in keywords.items():
        if name in RETIRED_OPTIONS:
            continue
        assert parameter.annotation == fields[name].replace("Path | None", "str | os.PathLike[str] | None"), name


def test_a_wrongly_typed_option_is_a_type_error(tmp_path):
    check = tmp_path / "check_init.py"
    check.write_text("import otel_rl\notel_rl.init('runs/x', jsonl='yes', span_budget_per_s=100)\n")
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "--ignore-missing-imports", str(check)],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 1 and '"jsonl"' in result.stdout and "span_budget_per_s" not in result.stdout, result.stdout


def test_a_retired_option_costs_one_warning_and_nothing_else(tmp_path, caplog):
    import json
    import logging

    import otel_rl

    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        tel = otel_rl.init(run_dir=tmp_path / "run", agent="thread", quiet=True, scalars_capacity=4096)
        with tel.run():
            tel.scalars({"Loss/critic": 1.0})
        tel.close()
    assert [r.getMessage() for r in caplog.records] == [
        "otel-rl: scalars_capacity no longer applies (scalars share the segment's data ring); ignored"
    ]
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["values"] for r in lines if r["kind"] == "scalars"] == [{"Loss/critic": 1.0}]
