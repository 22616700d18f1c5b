"""Spark fixtures: one local[2] SparkSession for the package (loopback only, UI off), and
a broker group of real processes (tests/integration/cluster.py) to read from and write to.

The session's Python workers find ``rmq`` through PYTHONPATH, and a generated
``pyspark_rmq`` shim module (``DefaultSource = rmq.spark.RmqDataSource``) in a temporary
directory on that path exercises Spark's data source auto-discovery.
"""
import os
import shutil
import sys
import tempfile
import time

import pytest

from rmq.launch import SAFE_PATH_ENV, use_safe_path_for_children

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIM = "from rmq.spark import RmqDataSource as DefaultSource  # noqa: F401\n"


def pytest_configure(config):
    config.addinivalue_line("markers", "spark: tests that start a local Spark session")
    # pyspark 4.3 warns about pandas 3 when it loads its pandas helpers; not our concern
    config.addinivalue_line("filterwarnings", "ignore:PySpark does not yet fully support pandas:FutureWarning")


def _spark_available() -> bool:
    if shutil.which("java") is None:
        return False
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError:
        return False
    return True


def pytest_collection_modifyitems(config, items):
    if _spark_available():
        return
    skip = pytest.mark.skip(reason="pyspark, pyarrow or java is missing")
    for item in items:
        if item.get_closest_marker("spark") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="package")
def spark():
    """One local SparkSession for tests/spark (a JVM start and the Python workers' warm-up cost
    about 10 s each time), stopped after the package's last test."""
    from pyspark.sql import SparkSession

    shim_dir = tempfile.mkdtemp(prefix="rmq-spark-shim-")
    with open(os.path.join(shim_dir, "pyspark_rmq.py"), "w") as f:
        f.write(SHIM)
    saved = {k: os.environ.get(k) for k in ("SPARK_LOCAL_IP", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON",
                                            "PYTHONPATH", SAFE_PATH_ENV)}
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, shim_dir, saved["PYTHONPATH"]) if p)
    use_safe_path_for_children()         # as rmq demo flights: workers import rmq from PYTHONPATH / site-packages
    session = (SparkSession.builder.master("local[2]").appName("rmq-spark-tests")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2").config("spark.default.parallelism", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.streaming.pollingDelay", "10ms")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(shim_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from tests.integration.cluster import Cluster

    # SQL92 subscriptions (expressionType=SQL92) need the broker's property filter
    c = Cluster(tmp_path_factory.mktemp("rmq-spark") / "store", conf={"enablePropertyFilter": "true"})
    try:
        yield c
    finally:
        c.close()


def wait_for(pred, timeout_s=20.0, what="condition"):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"{what} not met within {timeout_s} s")
