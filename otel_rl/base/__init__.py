"""The ground floor: what every layer may use, and which knows nothing of runs, records or outputs.

- :mod:`~otel_rl.base.clock`, :mod:`~otel_rl.base.deadline`: wall and monotonic time, bounded waits.
- :mod:`~otel_rl.base.loops`: the background thread every output and the agent run on.
- :mod:`~otel_rl.base.drops`: the counters of what was dropped, and where.
- :mod:`~otel_rl.base.values`: values made JSON-safe, names cleaned and shortened.
- :mod:`~otel_rl.base.environment_variables`, :mod:`~otel_rl.base.tracker_options`: every variable read, and
  the experiment trackers' own options.
- :mod:`~otel_rl.base.extras`: the optional packages and the extras that install them.
- :mod:`~otel_rl.base.http_post`: an HTTP request bounded whole (connecting, sending, the answer).
- :mod:`~otel_rl.base.terminal`: otel-rl's own output to a terminal, bounded (a terminal that stops reading holds nothing).
- :mod:`~otel_rl.base.files`, :mod:`~otel_rl.base.processes`, :mod:`~otel_rl.base.user_dir`, :mod:`~otel_rl.base.log`,
  :mod:`~otel_rl.base.compat`: atomic files, processes, the user's private folders, logging, library versions.
"""
