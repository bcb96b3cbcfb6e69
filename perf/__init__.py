"""Performance regression job for the fused GQA attention block (see docs/perf.md)."""
