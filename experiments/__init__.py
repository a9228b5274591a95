"""The research on npas: experiments, their run harness, cached run records and reports (README.md)."""
