"""Benchmark harness: workloads, the infer / transformers / HTTP runners, metrics, results,
tables, plots and the roofline (``infer bench``)."""
