"""A run's folder and life on disk: its file names, its one writer, its resume, its provenance and its two lines.

- :mod:`~otel_rl.run.files`: every name in a run folder.
- :mod:`~otel_rl.run.folder`: the lock that makes one process the folder's writer, and the fresh folder beside a taken one.
- :mod:`~otel_rl.run.resume`: what a restarted run finds of its earlier parts.
- :mod:`~otel_rl.run.provenance`: the configuration (secrets redacted) and where the run came from.
- :mod:`~otel_rl.run.jsonl`: reading ``metrics.jsonl`` back.
- :mod:`~otel_rl.run.notices`: the start and end lines on standard error.
- :mod:`~otel_rl.run.media`: the videos and images a loop records, written into ``media/`` off the training thread.
"""
