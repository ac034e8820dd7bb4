"""The outputs, and the factory that builds them (:mod:`otel_rl.outputs.factory`).

OpenTelemetry (``otel``), ``motrix.metrics/v1`` (``motrix``), the Perfetto trace (``perfetto``), the run summary,
the experiment trackers (TensorBoard, W&B, Trackio, SwanLab, on ``tracker``), the panel and the committed stats'
tables, and the relay of a worker's cycles to its learner.
"""
