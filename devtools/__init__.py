"""Development tools of a source checkout, not shipped in the wheel: git
revisions and the original's checkout, the soak, faults, compile size, the
simulated GPU and replica measurements. Run from the checkout's root, e.g.
`python -m devtools.soak --hours 2` (docs/benchmarks.md)."""
