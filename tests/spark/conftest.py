"""The Spark tests' shared fixture: one local session for the whole run (its fixed cost is paid once)."""

from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Any:
    """A local[2] SparkSession (skips when pyspark or Java is missing, like the modules that use it)."""
    pytest.importorskip("pyspark")
    from dcpinspect.spark import check_java, get_session

    try:
        check_java()
    except Exception as exc:
        pytest.skip(f"Spark needs Java 17: {exc}")
    return get_session(cores=2)
