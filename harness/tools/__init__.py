"""Tools around the suite: the benchmark, compile warm-ups, the sanitizer replay."""
