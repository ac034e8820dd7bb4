"""The agent: a training process's outputs, run in a process of their own.

- :mod:`otel_rl.agent.launch`: the training process's side: its segment, the agent process it starts and watches.
- :mod:`otel_rl.agent.directory`: the agents' private directories, their locks, what crashes leave.
- :mod:`otel_rl.agent.segment_source`: a producer's segment as the pipeline's record source.
- :mod:`otel_rl.agent.serve`: the loop serving one producer: passes, commits, its requests, its death.
- :mod:`otel_rl.agent.service`: the agent process, serving every segment of its directory (a run's learner, workers and ranks).
"""
