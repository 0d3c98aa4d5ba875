"""Running a pass's blocks: the one block loop (order, prefetch, compute through the backend,
write-behind, journal marks after durable data, progress) behind the ``Executor`` seam."""
