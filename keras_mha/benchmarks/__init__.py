"""Benchmarks behind `keras-mha bench` (layers: attention speed; inspect_startup: CLI startup)."""
