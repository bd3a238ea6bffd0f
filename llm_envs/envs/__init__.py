"""The built-in environments, one per file."""
