"""Running trials on Ray, below the search and the certificate that both schedule them: the Ray session
(`session`: start, connect, resources, stop), what a worker runs (`worker`, `trial`, `climber` with its
checkpoints in `climb_store`), a finished run's objective values (`outcome`) and Ray's private APIs
(`ray_adapter`, pinned). It reads and writes the study (`npas.service.study`) and knows nothing of
samplers, plans or the ladder's scheduling."""
