"""Checks: numeric (reference vs backend), and the others that build on it."""
