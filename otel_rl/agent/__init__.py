"""Where a producer's outputs run: a process of their own (the agent), or a thread of the training process.

- :mod:`otel_rl.agent.hosts`: the :class:`~otel_rl.agent.hosts.Host` seam, and the thread host.
- :mod:`otel_rl.agent.launch`: the training process's side of an agent process: its segment, the agent it starts and watches.
- :mod:`otel_rl.agent.handshake`: the producer's side of the segment header's protocol (flush, close), both hosts' own.
- :mod:`otel_rl.agent.serve`: the loop serving one producer: passes, commits, its requests, its death.
- :mod:`otel_rl.agent.producer`: one producer's outputs and the pipeline feeding them.
- :mod:`otel_rl.agent.service`: the agent process, serving every segment of its directory (a run's learner, workers and ranks).
- :mod:`otel_rl.agent.directory`: the agents' private directories, their locks, what crashes leave.
- :mod:`otel_rl.agent.watch`, :mod:`otel_rl.agent.logs`: watching a producer; its warnings logged where it runs.
- :mod:`otel_rl.agent.trace_upload`, :mod:`otel_rl.agent.send_run`: a finished run sent to its service, in a process of its own.
"""
