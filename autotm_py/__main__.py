from autotm_py.cli import main

raise SystemExit(main())
