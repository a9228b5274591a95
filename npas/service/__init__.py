"""The search service, one sub-package per concept:

- `study`: a study in SQL storage: the storage and its URLs, the typed record of its settings, reading
  its trials back (`studies`), their tally and seed-noise statistics, study names, Optuna's private APIs.
- `search`: running a search: the checked `SearchPlan`, the driver that runs it, Ray execution
  (`runner`) and the trainable's `WorkerSpec` (`worker`), Tune's `Searcher` over an Optuna study,
  candidates, samplers, objective values, progress, driver fault tolerance, learned groups.
- `certify`: the fidelity certificate: which allocations to retrain (`targets`), retraining them at
  full fidelity (`retrain`), the certificate and its rank statistics (`certificate`, `fidelity`).
- `export`: picking a trial from the front (`picks`) and writing its allocation (`exporter`).
"""
