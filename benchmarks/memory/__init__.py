"""Memory: ``peak.py`` (each trainer's peak memory above the weights), ``sharded.py`` (what each
rank holds under FSDP2), ``lora.py`` (LoRA adapters against full weights: GRPO and ES peak memory,
time, trainable parameters and bytes per parameter, side by side)."""
