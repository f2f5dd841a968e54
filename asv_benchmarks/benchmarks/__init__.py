"""asv benchmarks of xmesh (run from ``asv_benchmarks/``; see the README's "Performance history")."""
