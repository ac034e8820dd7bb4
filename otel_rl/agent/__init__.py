"""The agent: the outputs of one or more producers, assembled outside their training threads.

- :mod:`otel_rl.core.pipeline`: raw records to assembled ones (:mod:`otel_rl.core.records`), fanned out to the sinks.
- :mod:`otel_rl.core.perf_windows`: the ``Perf/*`` timing windows the live outputs share.
- :mod:`otel_rl.agent.core`: reading a producer's segment (:mod:`otel_rl.shm.segment`) into its outputs; watching the producer.
- :mod:`otel_rl.agent.service`: the agent process, serving every segment of its directory (a run's learner, workers and ranks).
- :mod:`otel_rl.agent.host`: how a producer runs its agent: a process (started unless one serves) or a thread.
"""
