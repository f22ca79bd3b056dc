"""Parsers of profiler exports into pandas DataFrames. No CuPy: they run on recorded output."""
