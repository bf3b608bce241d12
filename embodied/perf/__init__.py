"""Performance and learning benchmarks (run as modules, e.g.
`python -m embodied.perf.learning`)."""
