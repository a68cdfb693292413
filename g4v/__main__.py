from g4v.cli import main

raise SystemExit(main())
