from async_tracker.cli.main import main

raise SystemExit(main())
