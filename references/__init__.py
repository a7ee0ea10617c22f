"""Independent references. Nothing here imports harness.backends (a mask written twice is the point)."""
