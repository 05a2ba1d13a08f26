"""From a run's ingress to its backends, on the tracker loop.

* :mod:`~async_tracker.pipeline.cutter`: records in call order become numbered batches.
* :mod:`~async_tracker.pipeline.run_pipeline`: one run: cuts, the memory bound, flush, close.
* :mod:`~async_tracker.pipeline.lane`: one backend of one run: its ordered log (in memory and
  on disk, :mod:`async_tracker.spool.log`) delivered oldest first, with retries and
  supervision.

The process-wide ticker that drives every run is the runtime's
(:mod:`async_tracker.runtime.flusher`).
"""
