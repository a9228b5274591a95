"""The search service: SQL storage (`storage`), the study's stored record (`study`), the Ray Tune
searcher over an Optuna study (`searcher`), Ray execution (`runner`), launching and resuming a
search (`driver`), and export of a chosen allocation (`exporter`)."""
