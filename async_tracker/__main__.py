from async_tracker.cli.main import entry

entry()
