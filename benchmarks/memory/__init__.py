"""Memory: ``peak.py`` (each trainer's peak memory above the weights), ``sharded.py`` (what each
rank holds under FSDP2)."""
