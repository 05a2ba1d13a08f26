"""The ``async-tracker`` command (also ``python -m async_tracker``)."""
