"""Exporters that sit behind the SDK's processors (OTLP span encoding, motrix, JSONL, Perfetto)."""
