"""The outputs, and the factory that builds them (:mod:`otel_rl.outputs.factory`).

OpenTelemetry (``otel``), ``motrix.metrics/v1`` (``motrix``), the Perfetto trace (``perfetto``), the run summary,
TensorBoard, W&B, the panel, and the relay of a worker's cycles to its learner.
"""
