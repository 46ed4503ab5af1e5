"""Where things are, for every test wherever it sits: the checkout, its captures and goldens, and ../shared beside it."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
CAPTURES = ROOT / "captures"
GOLDEN = TESTS / "golden"
SHARED = ROOT.parent / "shared"
THIRD_PARTY = SHARED / "captures" / "third-party"
SEEDS = SHARED / "seeds"
