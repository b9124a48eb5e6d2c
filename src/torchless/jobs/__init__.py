"""Work spread over processes or a cluster: executors (local pool, Dask) and range jobs."""
