"""What the suite draws: hypothesis strategies, profiles, the generated tests, pinned cases."""
