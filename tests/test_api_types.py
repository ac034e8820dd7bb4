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
