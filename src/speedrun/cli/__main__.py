from speedrun.cli.main import main

raise SystemExit(main())
