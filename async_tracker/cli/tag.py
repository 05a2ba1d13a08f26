"""``tag RUN [+TAG] [-TAG] [--note TEXT]``: add and remove a run's tags, set its note.

The changes are written as the run's own writes are (reserved metadata keys, see
:mod:`async_tracker.tags`), through an ``AppRun`` of that run that neither ends it nor beats
its heartbeat: tagging a finished run leaves it finished, tagging a live one leaves it to its
job. What the store cannot take now waits in the spool, for ``async-tracker sync``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from async_tracker.cli.common import (
    EXIT_FAILURE,
    CliError,
    check_known,
    read_or_fail,
    reader_for,
    to_json,
    tracker_and_label,
    warn,
)
from async_tracker.run import AppRun
from async_tracker.settings import RunOptions
from async_tracker.tags import check_note, split_metadata, tag_metadata


def changes(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The tags to add and to remove: ``+TAG`` and ``-TAG`` words (argparse hands a ``-TAG``
    over as an unknown option, see ``main``), and ``--add``/``--remove``."""
    add, remove = list(args.add or ()), list(args.remove or ())
    for word in [*args.CHANGE, *getattr(args, "extra", ())]:
        if word.startswith("+") and len(word) > 1:
            add.append(word[1:])
        elif word.startswith("-") and len(word) > 1 and not word.startswith("--"):
            remove.append(word[1:])
        else:
            raise CliError(f"expected +TAG or -TAG, got {word!r} (`async-tracker tag --help`)")
    try:
        tag_metadata(add, remove)  # every tag checked before anything is written
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return add, remove


def cmd_tag(args: argparse.Namespace) -> int:
    add, remove = changes(args)
    note: str | None = None
    if args.note is not None:
        try:
            note = check_note(args.note)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    tracker, label = tracker_and_label(args)
    reader = reader_for(args)
    # --timeout bounds the reads and how long the change may take to reach the store;
    # what it does not take by then stays in the spool.
    timeout = reader.timeout
    code = 0
    with read_or_fail(label):
        run_id = check_known(reader, args.RUN_ID)
        if add or remove or note is not None:
            # A writer of the run that is not its job: no end record at close (_replay, as
            # `sync` does: the job ends its run) and no heartbeat (the run is not alive
            # because of us). Its spool is the one ASYNC_TRACKER_SPOOL_DIR names, so what
            # the store does not take now is delivered by `async-tracker sync`.
            run = AppRun(
                run_id, [tracker], options=RunOptions.from_env(), heartbeat_s=0, _replay=True
            )
            try:
                if add:
                    run.add_tags(*add)
                if remove:
                    run.remove_tags(*remove)
                if note is not None:
                    run.set_note(note)
                report = run.flush(timeout)
                tags, note_now = run.tags(), run.note()
            finally:
                report = run.close(timeout)
            if not report.ok:
                warn(
                    f"run {run_id!r}: the change is not stored yet ({report}); "
                    "`async-tracker sync` delivers it"
                )
                code = EXIT_FAILURE
        else:
            _, tags, note_now = split_metadata(reader.metadata(run_id))
    if args.json:
        print(to_json({"run_id": run_id, "tags": sorted(tags), "note": note_now}))
    else:
        print(_text(run_id, sorted(tags), note_now))
    return code


def _text(run_id: str, tags: Sequence[str], note: str) -> str:
    lines = [f"run:  {run_id}", f"tags: {' '.join(tags) if tags else '(none)'}"]
    if note:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    # No -h: "-h" is how the tag "h" is removed (only --help shows the help). Short options
    # would swallow "-TAG" words (argparse reads "-hx" as -h x).
    p = sub.add_parser(
        "tag",
        parents=[common],
        add_help=False,
        help="add or remove a run's tags, set its note; print its tags",
        description=(
            "Adds (+TAG) and removes (-TAG) tags of a run and sets its note, then prints the "
            "run's tags and note; without changes it prints them. A tag holds letters, "
            "digits, '_', '.' and '-', and starts with a letter, digit or '_'. The run's "
            "status is left as it is."
        ),
        usage="async-tracker tag RUN_ID [+TAG ...] [-TAG ...] [--note TEXT]",
    )
    p.add_argument("--help", action="help", help="show this help message and exit")
    p.add_argument("RUN_ID", help="the run (its id or a unique prefix)")
    p.add_argument("CHANGE", nargs="*", help="+TAG adds a tag, -TAG removes one")
    p.add_argument("--note", metavar="TEXT", help="set the run's note ('' clears it)")
    p.add_argument("--add", action="append", metavar="TAG", help="add TAG (as +TAG)")
    p.add_argument("--remove", action="append", metavar="TAG", help="remove TAG (as -TAG)")
    # "-TAG" words reach the command as unknown options (see main.parse).
    p.set_defaults(func=cmd_tag, takes_extra=True)
