"""How work runs: worker processes, pytest, parallel checks, the mutation catalogue."""
