"""A run streaming to an ingest server with many keys and many events.

    python wide_target.py URL RUN_ID KEYS EVENTS
"""

from __future__ import annotations

import sys

import otel_rl

url, run_id, key_count, event_count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
keys = [f"Metric/{i:04d}" for i in range(key_count)]
# A close that waits long enough for the server to take 20,000 events and 12,000 points on a busy machine: the page is under test, not the deadline.
tel = otel_rl.init(run_id=run_id, motrix_url=url, perf_interval_s=0.2, system_metrics_interval_s=0, quiet=True, shutdown_timeout_s=120)
with tel.run(config={"constructor": 1, "__proto__": {"x": 2}}):
    for i in range(12):
        with tel.iteration(i, env_steps=8 * i):
            with tel.phase("learning"):
                pass
        tel.scalars({key: float(i + n) for n, key in enumerate(keys)})
    # The live queue holds 10,000 records and makes room by dropping the oldest scalars (metrics.jsonl keeps them): the
    # points go before the events, and the events in parts the queue holds, however slowly this machine sends them.
    tel.flush(120)
    for n in range(event_count):
        tel.event("note", n=n)
        if n % 5000 == 4999:
            tel.flush(120)
tel.close()
