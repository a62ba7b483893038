"""Benchmarks: run by their own commands (`just bench`), never as timed tests."""
