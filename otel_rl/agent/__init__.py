"""The agent: a producer's outputs assembled outside its training thread, fed over shared memory.

- :mod:`otel_rl.agent.segment`: the shared-memory layout, its writer and its reader.
- :mod:`otel_rl.agent.producer`: the producer's recorder and Telemetry (``agent="process"`` or ``"thread"``).
- :mod:`otel_rl.agent.core`: reading a segment into the outputs; watching the producer.
- :mod:`otel_rl.agent.host`: running the agent as a process or a thread.
"""
