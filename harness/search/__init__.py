"""What the suite draws: hypothesis strategies, profiles, pinned cases. It yields Cases and knows
nothing of processes (the tests that run them are harness/run/suite.py and its siblings)."""
