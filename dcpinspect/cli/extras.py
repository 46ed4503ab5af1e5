"""The optional parts of the install: which command needs which extra, and the one line that says so.

Rules:

1. The base install (``pip install dcpinspect``) decodes, reads captures,
   builds timelines and tables, plots and explores; it never needs pyspark,
   scapy or Jupyter.
2. A command that needs an extra imports it lazily and, when it is missing,
   says so in one line before doing anything else:
   ``dcpinspect: error: 'analyze' needs Spark: pip install 'dcpinspect[spark]'``.
"""

from __future__ import annotations

from importlib import import_module

from .command import CliError

__all__ = ["EXTRAS", "require"]

#: extra -> (the module it brings, what a user calls it)
EXTRAS: dict[str, tuple[str, str]] = {
    "spark": ("pyspark", "Spark"),
    "live": ("scapy", "scapy"),
    "notebook": ("jupyterlab", "JupyterLab"),
}


def require(command: str, extra: str) -> None:
    """Import the module of ``extra``, or raise :class:`CliError` saying which ``pip install`` brings it."""
    module, what = EXTRAS[extra]
    try:
        import_module(module)
    except ImportError:
        raise CliError(f"{command!r} needs {what}: pip install 'dcpinspect[{extra}]'") from None
