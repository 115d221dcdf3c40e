"""The benchmark suite: speed/ (timings against a peer or a roofline), tables/ (the papers'
tables and ablations at demo scale), analyses/ (what a result is made of), each script an
absl program run as `python -m benchmarks.<genre>.<name>` that appends its numbers to
results.jsonl through `benchmarks.common`; `python -m benchmarks.report` writes
BENCHMARKS.md from them. The checks against the official PyTorch code are tests
(tests/test_parity_*.py, `make test-parity`)."""
