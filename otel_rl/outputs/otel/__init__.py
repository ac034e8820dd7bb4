"""OpenTelemetry: spans, metric aggregation and OTLP.

``sink`` (records to SDK spans, metrics and logs), ``spans`` (ids and the
span budget), ``aggregation`` (histograms, gauges and exemplars),
``span_encoder`` (spans encoded straight to OTLP protobuf) and ``otlp``
(exporters built from the ``OTEL_*`` variables).
"""
