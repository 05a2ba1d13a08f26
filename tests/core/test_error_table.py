"""One error boundary: every backend's failure is mapped once, through one declarative table
shared by the backends (errnos, HTTP statuses, S3 codes, exception types by name), to which a
backend adds its own rows; and the class retried after a cooldown has an honest name."""

from __future__ import annotations

import builtins
import errno
import re
import sys
from collections.abc import Callable

import pytest

from async_tracker import AppRun, BackendUnavailableError, PermanentBackendError
from async_tracker.backend.errors import map_failure
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.error_table import SHARED_TABLE, ErrorTable, Kind, MessageRow
from async_tracker.errors import (
    BackendError,
    RecordError,
    TransientBackendError,
    classify,
)
from async_tracker.records import Batch

if sys.version_info < (3, 11):  # pragma: no cover - 3.10
    from exceptiongroup import ExceptionGroup

MakeRun = Callable[..., AppRun]
CLASSES: dict[Kind, type[BackendError]] = {
    "transient": TransientBackendError,
    "backend": BackendUnavailableError,
    "record": RecordError,
}


def named(qualified: str) -> type[Exception]:
    """A class that looks like a library's (``module.Name``), without importing it."""
    module, _, name = qualified.rpartition(".")
    return type(name, (Exception,), {"__module__": f"{module}.exceptions"})


class WithStatus(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"answer {status}")
        self.status_code = status


class S3Error(Exception):
    """What botocore's ClientError carries: the S3 code and the answer's status."""

    def __init__(self, code: str, status: int | None) -> None:
        super().__init__(f"S3 {code}")
        meta = {} if status is None else {"HTTPStatusCode": status}
        self.response = {"Error": {"Code": code}, "ResponseMetadata": meta}


class WithCode(Exception):
    def __init__(self, code: str, text: str = "refused") -> None:
        super().__init__(text)
        self.error_code = code


def rows(table: ErrorTable) -> list[tuple[str, BaseException, Kind]]:
    """One failure per row of ``table`` (but its message rows), with the kind it declares."""
    out: list[tuple[str, BaseException, Kind]] = []
    out += [(f"errno {n}", OSError(n, "failed"), k) for n, k in table.errnos.items()]
    out += [(f"HTTP {s}", WithStatus(s), k) for s, k in table.statuses.items()]
    out += [(f"S3 {c}", S3Error(c, 400), k) for c, k in table.s3_codes.items()]
    out += [(f"code {c}", WithCode(c), k) for c, k in table.codes.items()]
    for name, kind in table.types.items():
        cls = named(name) if "." in name else getattr(builtins, name)
        out.append((f"type {name}", cls("failed"), kind))
        # A subclass of a listed class (EndpointConnectionError of botocore's ConnectionError).
        sub = type("Sub" + cls.__name__, (cls,), {"__module__": cls.__module__})
        out.append((f"subclass of {name}", sub("failed"), kind))
    return out


@pytest.mark.parametrize(
    ("what", "exc", "kind"), rows(SHARED_TABLE), ids=lambda v: v if isinstance(v, str) else ""
)
def test_each_row_of_the_shared_table_maps_as_declared(
    what: str, exc: BaseException, kind: Kind
) -> None:
    assert SHARED_TABLE.kind(exc) == kind, what
    mapped = map_failure(exc, lambda e: f"write of f failed: {e}")
    assert type(mapped) is CLASSES[kind], what
    assert str(mapped) == f"write of f failed: {exc}"
    # The lane decides by the same table whether a backend mapped the failure or not.
    assert classify(mapped) == kind and classify(exc) == kind, what


def test_the_shared_table_holds_what_every_backend_meets() -> None:
    table = SHARED_TABLE
    assert table.errnos[errno.ECONNRESET] == "transient"
    assert table.errnos[errno.ENOSPC] == "backend" and table.errnos[errno.EROFS] == "backend"
    assert table.errnos[errno.ENAMETOOLONG] == "record"
    assert table.statuses[503] == "transient" and table.statuses[429] == "transient"
    assert table.statuses[413] == "record" and 403 not in table.statuses
    assert table.s3_codes["SlowDown"] == "transient"
    assert table.s3_codes["EntityTooLarge"] == "record"
    for name in ("requests.Timeout", "botocore.ConnectionError", "aiohttp.ClientConnectionError"):
        assert table.types[name] == "transient"


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (WithStatus(403), "backend"),  # a status the table does not list: about the backend
        (S3Error("AccessDenied", 403), "backend"),  # an S3 code it does not list: by status
        (S3Error("SomethingNew", 502), "transient"),
        (S3Error("SomethingNew", None), "backend"),
        (OSError(errno.ENOEXEC, "odd"), "backend"),  # an errno it does not list
        (ValueError("unknown"), "backend"),
        (RuntimeError("unknown"), "backend"),
    ],
)
def test_what_the_table_does_not_list_keeps_the_records(exc: BaseException, kind: Kind) -> None:
    assert classify(exc) == kind
    assert type(map_failure(exc, str)) is CLASSES[kind]


def test_a_cause_in_the_chain_is_looked_up_by_type() -> None:
    endpoint = type("EndpointConnectionError", (named("botocore.ConnectionError"),), {})
    try:
        try:
            raise endpoint("no endpoint")
        except Exception as inner:
            raise RuntimeError("s3fs could not write") from inner
    except RuntimeError as exc:
        assert classify(exc) == "transient"


def test_a_backend_adds_its_rows_without_changing_the_shared_table() -> None:
    own = SHARED_TABLE.extend(
        codes={"RESOURCE_DOES_NOT_EXIST": "backend", "TOO_BIG": "record"},
        statuses={404: "transient"},
        messages=(MessageRow(re.compile("value .* too long"), "record", code="INVALID"),),
    )
    assert own.kind(WithCode("TOO_BIG")) == "record"
    assert own.kind(WithCode("RESOURCE_DOES_NOT_EXIST")) == "backend"
    assert own.kind(WithStatus(404)) == "transient"
    assert own.kind(WithCode("INVALID", "value x is too long")) == "record"
    # A message row with a code matches that code only.
    assert own.kind(WithCode("OTHER", "value x is too long")) is None
    assert own.errnos == SHARED_TABLE.errnos  # the shared rows are all there
    # The shared table is untouched.
    assert SHARED_TABLE.kind(WithCode("TOO_BIG")) is None
    assert SHARED_TABLE.kind(WithStatus(404)) == "backend"


def test_the_mlflow_rows_are_data_added_to_the_shared_table() -> None:
    pytest.importorskip("mlflow")
    from async_tracker.backend.mlflow.errors import MLFLOW_TABLE

    assert MLFLOW_TABLE.errnos == SHARED_TABLE.errnos
    assert MLFLOW_TABLE.statuses == SHARED_TABLE.statuses
    assert MLFLOW_TABLE.codes["RESOURCE_DOES_NOT_EXIST"] == "backend"
    assert MLFLOW_TABLE.codes["TEMPORARILY_UNAVAILABLE"] == "transient"
    refused = WithCode("INVALID_PARAMETER_VALUE", "Invalid value for parameter 'metrics[0]'")
    assert MLFLOW_TABLE.kind(refused) == "record"
    assert MLFLOW_TABLE.kind(WithCode("INVALID_PARAMETER_VALUE", "no such run")) == "backend"
    for what, exc, kind in rows(MLFLOW_TABLE):
        assert MLFLOW_TABLE.kind(exc) == kind, what


# -- mapped once -------------------------------------------------------------------------------


def test_an_error_already_mapped_is_returned_as_it_is() -> None:
    first = map_failure(OSError(errno.EIO, "io"), lambda e: f"write of a/b failed: {e}")
    again = map_failure(first, lambda e: f"call failed: {e}")
    assert again is first and str(again) == "write of a/b failed: [Errno 5] io"
    # Inside a group too: the parts keep their messages, never wrapped in another.
    group = ExceptionGroup("flush", [first])
    assert map_failure(group, lambda e: f"call failed: {e}") is first


@pytest.mark.parametrize("backend", ["fsspec", "tensorboard"])
def test_the_backends_map_a_mapped_error_no_more(backend: str) -> None:
    if backend == "fsspec":
        from async_tracker.backend.fsspec import map_error
    else:
        pytest.importorskip("tensorboard")
        from async_tracker.backend.tensorboard import map_error
    first = map_error(OSError(errno.ENOSPC, "full"), "write of run/x")
    assert map_error(first, "call") is first
    assert str(first).count("failed") == 1 and "write of run/x" in str(first)


class Counting(InMemoryTracker):
    """Fails its first writes with raw OSErrors; counts the mappings of its failures."""

    def __init__(self, failures: list[int]) -> None:
        super().__init__()
        self.failures = failures
        self.raised = 0
        self.mapped: list[BaseException] = []

    async def write_batch(self, run_id: str, batch: Batch) -> None:
        if self.failures:
            self.raised += 1
            raise OSError(self.failures.pop(0), "disk trouble")
        await super().write_batch(run_id, batch)

    def map_error(self, exc: BaseException) -> BaseException:
        self.mapped.append(exc)
        return map_failure(exc, lambda e: f"counting write failed: {e}")


class Unmapped(Counting):
    def map_error(self, exc: BaseException) -> BaseException:
        return exc


def test_the_lane_maps_each_failure_once_at_its_edge(make_run: MakeRun) -> None:
    backend = Counting([errno.EIO, errno.ECONNRESET, errno.EAGAIN])
    run = make_run("r", [backend])
    for step in range(5):
        run.log_metric("m", float(step), step=step)
    report = run.close(30)
    assert report.delivered == 5 and not report.spooled, report
    # One mapping per failure, each of the raw error (never of one already mapped).
    assert len(backend.mapped) == backend.raised == 3
    assert not any(isinstance(e, BackendError) for e in backend.mapped), backend.mapped
    error = run.status().backends["Counting"].last_error or ""
    assert error.count("counting write failed") == 1, error


def test_the_lane_classifies_a_raw_failure_by_the_shared_table(make_run: MakeRun) -> None:
    # A backend that maps nothing (the default map_error): an errno the shared table calls
    # about the record drops that batch's records alone instead of retrying for ever.
    backend = Unmapped([errno.ENAMETOOLONG])
    run = make_run("r", [backend])
    run.log_metric("m", 1.0, step=0)
    report = run.close(30)
    assert report.dropped == 1 and not report.spooled, report


# -- the name of the class retried after a cooldown ----------------------------------------------


def test_permanent_backend_error_is_a_deprecated_alias() -> None:
    import async_tracker.errors as errors

    assert PermanentBackendError is BackendUnavailableError
    assert isinstance(BackendUnavailableError("x"), PermanentBackendError)
    assert isinstance(PermanentBackendError("x"), BackendUnavailableError)
    assert issubclass(RecordError, BackendUnavailableError)
    with pytest.raises(BackendUnavailableError):
        raise PermanentBackendError("old name")
    assert classify(PermanentBackendError("old name")) == "backend"
    assert BackendUnavailableError.__name__ == "BackendUnavailableError"
    assert errors.__doc__ is not None and "deprecated alias" in errors.__doc__
