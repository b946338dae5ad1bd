"""Benchmarks of zns against a bare pyzmq echo server and RocketMQ's defaults.

`python -m bench.run_all` (or `make bench`) runs every benchmark and writes
`bench/results.md` and `bench/results.json`; each module also runs alone.
"""
