from speedrun.cli.train import main

raise SystemExit(main())
