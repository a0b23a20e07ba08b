"""Benchmarks for lcm-proxy: ``python -m bench [NAME ...]`` prints one table per benchmark."""
