"""The OpenTelemetry output: spans, metrics and logs through the SDK and OTLP.

``sink`` (records to spans, metrics and log records), ``spans`` (span ids and the
span budget), ``span_encoder`` (spans encoded straight to OTLP protobuf),
``metrics`` (the aggregates as OpenTelemetry metrics, joined to every export),
``otlp`` (exporters built from the ``OTEL_*`` variables) and ``user_providers``
(SDK providers for the user's own spans and instruments where the outputs run
in an agent).
"""
