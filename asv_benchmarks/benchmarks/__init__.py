"""asv benchmarks of xmesh (run from ``asv_benchmarks/``; the manual's docs/gpu.md, "Benchmarks", says how)."""
