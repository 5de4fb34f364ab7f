"""Test-only harnesses, kept out of the installed package: fuzzing, kill -9 crashes, fault injection,
overload, corrupted and torn segments, forking producers, receiver faults, and the trace builders and
workloads they share. The tests and the benchmarks (benchmarks/) import them from the repository root."""
