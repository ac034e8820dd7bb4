"""The shipped Prometheus alerting rules: generated from the schema, valid, and unit-tested with promtool."""

from __future__ import annotations

import subprocess
import sys

from locations import REPO

CONFIG = REPO / "collector-config"


def test_the_committed_rules_are_current():
    result = subprocess.run([sys.executable, str(CONFIG / "alert_rules.py"), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_rules_are_valid_promql():
    result = subprocess.run(["promtool", "check", "rules", str(CONFIG / "alerts.yaml")], capture_output=True, text=True)
    assert result.returncode == 0 and "6 rules found" in result.stdout, result.stdout + result.stderr


def test_every_rule_fires_when_it_should_and_only_then():
    result = subprocess.run(["promtool", "test", "rules", str(CONFIG / "alerts.test.yaml")], capture_output=True, text=True)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr
    tested = {line.split(":", 1)[1].strip() for line in (CONFIG / "alerts.test.yaml").read_text().splitlines() if "alertname:" in line}
    shipped = {line.split(":", 1)[1].strip() for line in (CONFIG / "alerts.yaml").read_text().splitlines() if "- alert:" in line}
    assert tested == shipped  # no rule without a test
