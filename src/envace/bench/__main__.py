"""``python -m envace.bench``: the same as ``envace bench``."""

from envace.bench import main

raise SystemExit(main())
