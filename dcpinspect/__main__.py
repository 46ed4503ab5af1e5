"""``python -m dcpinspect`` is the ``dcpinspect`` command."""

from .cli.main import main

raise SystemExit(main())
