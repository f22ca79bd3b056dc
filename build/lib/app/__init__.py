"""Kernel profiling rails: a spatial join and a polygon overlay, profiled stage by stage."""
