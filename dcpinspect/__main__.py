"""``python -m dcpinspect`` is the ``dcpinspect`` command."""

from .cli import main

raise SystemExit(main())
