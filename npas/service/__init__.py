"""The search service: SQL storage (`storage`), the study's stored record (`record`), reading
studies back (`study`), samplers (`samplers`), the Ray Tune searcher over an Optuna study
(`searcher`) with its objective values (`outcome`) and progress (`progress`), driver fault tolerance
(`faults`), Ray execution (`runner`), launching and resuming a search (`driver`), export of a chosen
allocation (`exporter`), and the private Optuna APIs npas uses (`optuna_adapter`)."""
