"""MLflow backend: one async implementation, a torchx-compatible sync face, and a factory.

* :class:`AsyncMLflowTracker` is the ``AsyncTrackerBase`` (``tracker.py``).
* :class:`MLflowTracker` is its blocking twin, with torchx's constructor
  ``MLflowTracker(experiment_name=None, tracking_uri=..., artifact_location=None)`` plus
  ``close()`` and ``log_params_flat`` (``sync.py``). ``AppRun`` unwraps it and talks to the
  async backend.
* :func:`create_tracker` is the ``mlflow`` factory: it reads the ``[tracker:mlflow]`` section
  of a ``.torchxconfig`` file (a directory holding one, or the file's path).

The modules, in the order a record meets them: ``config`` (defaults, the config file),
``mapping`` (what a record becomes in MLflow, and MLflow's limits on it: ``validate``),
``requests`` (a flush cut into ``log_batch`` requests), ``runs`` (finding, creating and
ending the MLflow run of a run id, across ranks), ``summaries`` (each writer's summary of a
run, a tag sent with its flushes), ``errors`` (the client's errors mapped to retry, keep or
drop), ``tracker`` and ``sync``; and on the read side ``reader`` (the run list from
``search_runs`` and the summaries: ``AsyncMLflowTracker.reader()``).

How a run maps onto MLflow::

    run id "app-123"  ->  one MLflow run in the tracker's experiment, shared by every rank:
                          run name "app-123", tag async_tracker.run_id = "app-123",
                          tag async_tracker.run_key = sha1("app-123") (what searches use)
    add_metadata(k=v) ->  tag k = json(v) (values round-trip; the latest write wins), and
                          the first write of k is also logged as params (flattened)
    add_tags(t)       ->  tag async_tracker.tag.<t> = "true" ("false" once removed)
    set_note(text)    ->  tag mlflow.note.content (the run's description in the UI)
    add_artifact(n,p) ->  p uploaded to <n>/ of the run's artifacts when it is a local file
                          or directory; a tag holding {name, path, metadata}
    add_source(s, a)  ->  tags (so that sources(), lineage() and run_ids() round-trip)
    log_metric        ->  metric points via log_batch, client timestamps (ms) and steps
    log_params_flat   ->  params
    each flush        ->  tag async_tracker.summary.<writer> = the writer's summary (what the
                          run list reads: one search_runs page per 1,000 runs, no point read)
    AppRun closes     ->  FINISHED once the last rank is done; FAILED / KILLED at once

Example::

    from async_tracker import AppRun
    from async_tracker.backend.mlflow import MLflowTracker

    tracker = MLflowTracker(experiment_name="demo", tracking_uri="http://127.0.0.1:5000")
    with AppRun("my-run", [tracker]) as run:
        run.add_metadata(lr=0.01)
        run.log_metric("loss", 0.5, step=1)
    # the MLflow run is FINISHED here (FAILED if the block raised)
"""

from async_tracker.backend.mlflow.config import (
    DEFAULT_TRACKING_DIR,
    default_experiment_name,
    default_tracking_uri,
    read_config,
)
from async_tracker.backend.mlflow.errors import AmbiguousRunError, map_error
from async_tracker.backend.mlflow.mapping import (
    MAX_KEY_LENGTH,
    MAX_PARAM_VALUE_LENGTH,
    MAX_TAG_VALUE_LENGTH,
    TAG_RUN_ID,
    TAG_RUN_KEY,
    TAG_WRITER_PREFIX,
    flatten_params,
    run_key,
)
from async_tracker.backend.mlflow.requests import (
    MAX_ITEMS_PER_REQUEST,
    MAX_METRICS_PER_REQUEST,
    MAX_PARAMS_PER_REQUEST,
    MAX_REQUEST_BYTES,
    MAX_TAGS_PER_REQUEST,
    plan_requests,
)
from async_tracker.backend.mlflow.sync import MLflowTracker, create_tracker
from async_tracker.backend.mlflow.tracker import AsyncMLflowTracker

__all__ = [
    "DEFAULT_TRACKING_DIR",
    "MAX_ITEMS_PER_REQUEST",
    "MAX_KEY_LENGTH",
    "MAX_METRICS_PER_REQUEST",
    "MAX_PARAMS_PER_REQUEST",
    "MAX_PARAM_VALUE_LENGTH",
    "MAX_REQUEST_BYTES",
    "MAX_TAGS_PER_REQUEST",
    "MAX_TAG_VALUE_LENGTH",
    "TAG_RUN_ID",
    "TAG_RUN_KEY",
    "TAG_WRITER_PREFIX",
    "AmbiguousRunError",
    "AsyncMLflowTracker",
    "MLflowTracker",
    "create_tracker",
    "default_experiment_name",
    "default_tracking_uri",
    "flatten_params",
    "map_error",
    "plan_requests",
    "read_config",
    "run_key",
]
