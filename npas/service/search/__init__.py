"""Running a search: a checked `SearchPlan` (`plan`) run by the `driver` on Ray (`runner`, `worker`,
`ray_adapter`) through Tune's `Searcher` (`searcher`) over an Optuna study, with its candidates,
samplers, objective values (`outcome`), progress, fault tolerance (`faults`) and learned groups."""
