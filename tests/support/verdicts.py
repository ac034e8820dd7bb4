"""A comparison's verdict without the caveat a busy or changed host puts first (what follows is what the tests assert).

``otel-rl analyze --compare`` leads with "a busy host (...): expect changes
from the host alone. " or "the hosts differed (...): the change may be ... "
when the machine was loaded while the runs ran: true of the machine, not of
the runs, and it depends on what else the machine was doing.
"""

from __future__ import annotations

import re

_CAVEAT = re.compile(
    r"^(?:verdict: )?(?:(?:the same settings, but )?the hosts differed \(.*?\): the change may be [^.]*\. "
    r"|a busy host \(.*?\)(?: with the same settings)?: expect changes from the host alone\. )"
)


def finding(verdict: str) -> str:
    """``verdict`` from its finding on: ``Learning +30% ...``, ``nothing changed beyond noise ...``."""
    return _CAVEAT.sub("", verdict, count=1).removeprefix("verdict: ")
