"""The thread host's switch interval: shortened while it serves, only where Python's default was left, and put back.

Each check runs in a fresh interpreter: the interval is the whole process's.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run(script: str, tmp_path) -> None:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_a_thread_host_shortens_the_default_interval_while_it_serves(tmp_path):
    run(
        """
        import sys, otel_rl
        from otel_rl.agent import switching
        assert sys.getswitchinterval() == switching.PYTHON_DEFAULT_S
        options = dict(agent="thread", quiet=True, system_metrics_interval_s=0)
        first = otel_rl.init(run_dir=sys.argv[1] + "/a", **options)
        second = otel_rl.init(run_dir=sys.argv[1] + "/b", **options)
        assert sys.getswitchinterval() == switching.SERVING_INTERVAL_S
        first.close()
        assert sys.getswitchinterval() == switching.SERVING_INTERVAL_S  # the other one still serves
        second.close()
        assert sys.getswitchinterval() == switching.PYTHON_DEFAULT_S
        """,
        tmp_path,
    )


def test_an_interval_the_user_chose_is_left_alone(tmp_path):
    run(
        """
        import sys, otel_rl
        sys.setswitchinterval(0.002)
        tel = otel_rl.init(run_dir=sys.argv[1], agent="thread", quiet=True, system_metrics_interval_s=0)
        assert sys.getswitchinterval() == 0.002
        tel.close()
        assert sys.getswitchinterval() == 0.002
        """,
        tmp_path,
    )
