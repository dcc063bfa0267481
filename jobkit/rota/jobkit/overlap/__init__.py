"""Communication-computation overlap for model-parallel jobs (Helix): capture, tiling, reordering, bucketing, a graph simulator."""
