"""Optional tools around the suite: the benchmark, the sanitizer replay, GPU set-up, FP8 noise.
Nothing the check runs imports them."""
