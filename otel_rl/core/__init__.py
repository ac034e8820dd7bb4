"""The core: the records, the pipeline that assembles them, and the plain data outputs are built from.

- :mod:`otel_rl.core.records`: what every sink receives.
- :mod:`otel_rl.core.pipeline`: record sources in, assembled records out; the sink contract (:class:`~otel_rl.core.pipeline.RecordSink`).
- :mod:`otel_rl.core.identity`: :class:`~otel_rl.core.identity.RunIdentity`, what a host builds a producer's outputs from.
- :mod:`otel_rl.core.perf_windows`, :mod:`otel_rl.core.system_metrics`: ``Perf/*`` windows, ``sys/*`` samples.
- :mod:`otel_rl.core.inbox`: the records made beside the outputs (system metrics, relayed cycles), a record source of its own.
"""
