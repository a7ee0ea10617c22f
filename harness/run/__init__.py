"""How the suite runs: its tests, worker processes and isolation, the pytest plugin, the check
(check.py: a CheckRequest in, a RunResult out), repro, and the speed part (speed/)."""
