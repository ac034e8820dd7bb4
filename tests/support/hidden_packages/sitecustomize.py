"""Hides the packages named in OTEL_RL_TEST_HIDE from the import system, as if they were not installed.

On ``PYTHONPATH``, Python imports this at start-up in every process of a test
(the training script and the agent it starts). With
``OTEL_RL_TEST_HIDE_IN_AGENT=1`` only agent processes lose them: an agent
that cannot import what the training process could.
"""

import os
import sys


class _Hidden:
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


_names = set(filter(None, os.environ.get("OTEL_RL_TEST_HIDE", "").split(",")))
_agent = "--dir" in sys.argv  # the agent's command line: python -c ... --dir DIRECTORY
if _names and (not os.environ.get("OTEL_RL_TEST_HIDE_IN_AGENT") or _agent):
    sys.meta_path.insert(0, _Hidden(_names))
