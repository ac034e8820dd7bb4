"""The shared-memory format between a training process and its agent (:mod:`otel_rl.shm.segment`)."""
