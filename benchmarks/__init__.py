"""Speed and memory measurements, and the configurations that reproduce the paper's runs."""
