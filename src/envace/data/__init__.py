"""Benchmark sources, grounding, splits and the DataModule."""
