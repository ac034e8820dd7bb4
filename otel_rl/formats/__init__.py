"""What otel-rl writes, as formats others read: the one definition of each, imported by writers and readers alike.

- :mod:`~otel_rl.formats.schema`: the metric schema (canonical keys, phases, units, library tags, legacy tags).
- :mod:`~otel_rl.formats.protocol`: ``motrix.metrics/v1`` records (``motrix-metrics-v1.schema.json`` beside it).
- :mod:`~otel_rl.formats.trace`: the Perfetto trace's names, tracks and debug annotations.
- :mod:`~otel_rl.formats.protowire`: the protobuf wire format, for encoders that write it straight.
"""
