"""Whether two samples of cycle durations differ: the Mann-Whitney rank-sum test.

Ranks, not values: one stalled cycle moves a mean far but a rank by one,
so a single host stall cannot make a change significant. The p-value uses
the normal approximation with the tie correction (exact enough from about
ten cycles a side, the least a comparison accepts); ``analyze`` keeps this
self-contained so that it needs no extra package.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def rank_sum_p(a: Sequence[float], b: Sequence[float]) -> float:
    """The two-sided p-value that ``a`` and ``b`` come from one distribution (1.0 when either is empty or all values tie)."""
    n1, n2 = len(a), len(b)
    if not n1 or not n2:
        return 1.0
    pooled = sorted([(x, 0) for x in a] + [(x, 1) for x in b])
    n = n1 + n2
    rank_sum = ties = 0.0
    i = 0
    while i < n:
        j = i
        while j + 1 < n and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        rank = (i + j) / 2 + 1  # tied values share their average rank
        rank_sum += rank * sum(1 for k in range(i, j + 1) if pooled[k][1] == 0)
        ties += (j - i + 1) ** 3 - (j - i + 1)
        i = j + 1
    u = rank_sum - n1 * (n1 + 1) / 2
    variance = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if variance <= 0:
        return 1.0
    z = max(abs(u - n1 * n2 / 2) - 0.5, 0.0) / math.sqrt(variance)  # with the continuity correction
    return math.erfc(z / math.sqrt(2))
