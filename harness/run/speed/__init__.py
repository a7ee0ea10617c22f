"""The speed machinery: placeholder."""
