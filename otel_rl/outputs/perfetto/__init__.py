"""The Perfetto trace: ``trace`` (the encoder, the writer thread and the merging of
worker fragments); slices are encoded in C by ``_slices.c`` where it is built."""
