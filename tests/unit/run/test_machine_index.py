"""A machine a launcher does not number is told apart by its whole id: no two machines of a job write one trace part."""

from __future__ import annotations

import secrets

from otel_rl.config import host_machine


def test_ten_thousand_machines_of_one_host_name_get_ten_thousand_indices():
    # 10,000 machines: a 16-bit index gives hundreds of pairs (the birthday bound); 63 bits give none.
    indices = {host_machine("node", secrets.token_hex(16)) for _ in range(10_000)}
    assert len(indices) == 10_000
    assert all(0 < index < 2**63 for index in indices)  # 0 stays rank 0's machine; an int64 everywhere it goes
    assert host_machine("node", "ab" * 16) == host_machine("node", "ab" * 16)  # every rank of one machine: one index
