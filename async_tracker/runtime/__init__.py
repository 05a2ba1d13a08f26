"""The process: one ``Runtime`` per process (``runtime()``) owns the tracker loop, the worker
threads, the spool thread, the flusher, and how runs end at exit, on SIGTERM and across a
fork.

* :mod:`~async_tracker.runtime.process`: the ``Runtime``, its runs, exit, SIGTERM and fork;
  ``runtime()`` and ``run_blocking()`` are imported from there.
* :mod:`~async_tracker.runtime.loop`: the tracker loop, and how other threads and event loops
  wait for it.
* :mod:`~async_tracker.runtime.threads`: the worker-thread pool for blocking calls.
* :mod:`~async_tracker.runtime.flusher`: the ticker that drives every run's pipeline.
* :mod:`~async_tracker.runtime.writers`: the runs writing now, which reads wait for.
* :mod:`~async_tracker.runtime.signals`: which thread a SIGTERM or a Ctrl-C reaches.

This module imports nothing: the spool's I/O uses the signals module, and the process module
uses the spool's I/O.
"""
