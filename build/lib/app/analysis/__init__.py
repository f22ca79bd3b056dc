"""Analyses over traces and tool tables: plain functions, no CuPy, runnable anywhere."""
