"""Performance benchmarks of npas, each with its target (README.md lists them); run from the checkout."""
