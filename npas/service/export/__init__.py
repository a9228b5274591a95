"""Export: a trial picked from a study's front (`picks`) and its allocation written as YAML (`exporter`)."""
