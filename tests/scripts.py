"""The project's stand-alone scripts (``benchmarks/``, ``captures/``) as modules, for tests that run a slice of them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relpath: str) -> ModuleType:
    """``ROOT/relpath`` imported once under its file's stem (registered first: its dataclasses look their module up)."""
    path = ROOT / relpath
    loaded = sys.modules.get(path.stem)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
