"""What reads the outputs: ``otel-rl analyze`` (:mod:`otel_rl.readers.analysis`) and the ingest server (:mod:`otel_rl.readers.server`)."""
