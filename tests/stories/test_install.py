"""The README's install: a wheel built from the clone, installed apart from it, is the whole package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a package build: pytest -m 'not slow' leaves it out

ROOT = Path(__file__).resolve().parents[2]
CHECK = """
import json, sys, otel_rl
import otel_rl.training._hotpath, otel_rl.outputs.motrix._lines  # the C fast paths were built into the wheel
from importlib import resources

tel = otel_rl.init(run_dir=sys.argv[1], quiet=True, panel=False)
with tel.run():
    for i in range(20):
        with tel.iteration(i, env_steps=i):
            with tel.phase("learning"):
                pass
        tel.scalars({"Loss/critic": float(i)})
tel.close()
static = resources.files("otel_rl.readers.server") / "static"
print(json.dumps({"file": otel_rl.__file__, "schemas": sorted(p.name for p in resources.files("otel_rl.formats").iterdir() if p.name.endswith(".schema.json")),
                  "page": (static / "index.html").is_file(), "uplot": any((static / "vendor" / "uplot").iterdir())}))
"""


def test_a_wheel_built_from_the_clone_installs_the_whole_package(tmp_path):
    # The build backend is the test environment's own (setuptools, in the test extra): the build needs no package index.
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(ROOT)],
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("otel_rl-*.whl")
    target = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MOTRIX_")) or k == "OTEL_RL_RUN_DIR"}
    env["PYTHONPATH"] = str(target)  # ahead of the clone's editable install
    result = subprocess.run([sys.executable, "-c", CHECK, str(tmp_path / "run")], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["file"].startswith(str(target))
    assert found["schemas"] and found["page"] and found["uplot"]
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["status"] for r in lines if r["kind"] == "run"] == ["pending", "running", "finished"]
    assert sum(1 for r in lines if r["kind"] == "scalars" and "Loss/critic" in r["values"]) == 20
