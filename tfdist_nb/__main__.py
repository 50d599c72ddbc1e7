from tfdist_nb.cli import main

raise SystemExit(main())
