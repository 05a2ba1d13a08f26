"""A run's tags and note in MLflow, against a real server: each tag an MLflow tag
``async_tracker.tag.<t>`` ("true", "false" once removed) that searches find, never a param;
the note MLflow's own description tag (``mlflow.note.content``), which an edit in the UI
changes; and ``AppRun.tags()``/``note()`` read back over MLflow."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from async_tracker import AppRun
from async_tracker.backend.mlflow import MLflowTracker
from async_tracker.tags import NOTE_KEY, TAG_KEY_PREFIX


@pytest.fixture
def tracker(tracking_uri: str, experiment_name: str) -> Iterator[MLflowTracker]:
    t = MLflowTracker(experiment_name, tracking_uri)
    yield t
    t.close()


def mlflow_run(client: Any, experiment_name: str, run_id: str) -> Any:
    experiment = client.get_experiment_by_name(experiment_name)
    (run,) = client.search_runs(
        [experiment.experiment_id], f"tags.`async_tracker.run_id` = '{run_id}'"
    )
    return run


def test_tags_and_the_note_round_trip_as_mlflow_tags(
    tracker: MLflowTracker, client: Any, experiment_name: str
) -> None:
    with AppRun("tagged", [tracker]) as run:
        run.add_metadata(lr=0.1)
        run.add_tags("baseline", "v1.2", "draft")
        run.set_note("first try")
        run.log_metric("loss", 1.0, step=0)
        assert run.flush(60).ok
        run.remove_tags("draft")
        run.set_note("the run that set the baseline")
        assert run.tags() == {"baseline", "v1.2"}
        assert run.note() == "the run that set the baseline"
        assert run.metadata() == {"lr": 0.1}
    stored = mlflow_run(client, experiment_name, "tagged")
    tags = stored.data.tags
    assert tags[TAG_KEY_PREFIX + "baseline"] == "true"
    assert tags[TAG_KEY_PREFIX + "v1.2"] == "true"
    assert tags[TAG_KEY_PREFIX + "draft"] == "false"
    assert tags["mlflow.note.content"] == "the run that set the baseline"
    assert NOTE_KEY not in tags
    # Tags and the note are never params (params are immutable: a tag could not be removed).
    assert stored.data.params == {"lr": "0.1"}
    # MLflow's search finds runs by tag.
    experiment = client.get_experiment_by_name(experiment_name)
    found = client.search_runs(
        [experiment.experiment_id], f"tags.`{TAG_KEY_PREFIX}baseline` = 'true'"
    )
    assert [r.info.run_id for r in found] == [stored.info.run_id]
    assert not client.search_runs(
        [experiment.experiment_id], f"tags.`{TAG_KEY_PREFIX}draft` = 'true'"
    )
    # A description edited in the MLflow UI is the note read back.
    client.set_tag(stored.info.run_id, "mlflow.note.content", "edited in the UI")
    reader = AppRun("tagged", [tracker])
    assert reader.note() == "edited in the UI"
    assert reader.tags() == {"baseline", "v1.2"}
    assert reader.metadata() == {"lr": 0.1}


def test_reserved_keys_are_refused_and_bad_tags_named(tracker: MLflowTracker) -> None:
    with AppRun("refusals", [tracker]) as run:
        with pytest.raises(ValueError, match=r"'async_tracker\.tag\.x'.*reserved"):
            run.add_metadata(**{"async_tracker.tag.x": True})
        with pytest.raises(ValueError, match=r"'mlflow\.note\.content'.*reserved"):
            run.add_metadata(**{"mlflow.note.content": "not this way"})
        with pytest.raises(ValueError, match="'a b'"):
            run.add_tags("ok", "a b")
        with pytest.raises(ValueError, match="the note is 8001 characters; MLflow allows 8000"):
            run.set_note("x" * 8001)
        run.add_tags("ok")
        run.set_note("x" * 8000)
    reader = AppRun("refusals", [tracker])
    assert reader.tags() == {"ok"} and reader.note() == "x" * 8000
    # The torchx face refuses reserved keys too.
    with pytest.raises(ValueError, match="reserved"):
        tracker.add_metadata("refusals", **{"async_tracker.note": "no"})
