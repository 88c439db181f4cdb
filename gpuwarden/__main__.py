"""``python -m gpuwarden <command>``, the same as the ``gpuwarden`` command."""

from gpuwarden.cli import main

raise SystemExit(main())
