"""How rmq starts Python child processes: always from the *installed* ``rmq``.

``python -m MODULE`` (and ``python script.py``, ``python -c``) puts the current directory (the
script's directory) first on ``sys.path``.  Run from a source checkout after a non-editable
``pip install .``, that made every child import the source tree's ``rmq/`` (no compiled
``rmq._core`` extensions there) instead of the installed package, and the embedded cluster of
``rmq demo flights`` died at start (issue 19).  Python 3.11's safe-path mode (``-P``, or the
environment variable ``PYTHONSAFEPATH``) leaves that entry out; ``PYTHONPATH`` and ``.pth``
files (an editable install's finder) still apply.

Every process the project starts goes through here:

- :func:`python_argv` for an actor, a supervisor or any other ``-m`` child;
- :func:`child_env` for its environment (also carries safe-path mode to grandchildren that
  are not started through :func:`python_argv`, e.g. multiprocessing's spawn);
- :func:`use_safe_path_for_children` before a process starts Spark, whose Python workers
  (``python -m pyspark.daemon``, started by the JVM in the driver's directory) inherit the
  driver's environment.
"""
from __future__ import annotations

import os
import sys
from typing import Mapping, Optional

__all__ = ["SAFE_PATH_ENV", "python_cmd", "python_argv", "child_env", "use_safe_path_for_children"]

#: Python >= 3.11: any non-empty value = ``-P`` (do not prepend the script's / current directory)
SAFE_PATH_ENV = "PYTHONSAFEPATH"


def python_cmd(*args: str, executable: Optional[str] = None) -> list:
    """The command line ``python -P args...`` with this interpreter (``executable`` overrides
    ``sys.executable``), e.g. ``python_cmd("-m", "rmq.actors.broker", "--listen-port", "0")``.
    Returns a new list of str."""
    return [executable or sys.executable, "-P", *map(str, args)]


def python_argv(module: str, *args: str, executable: Optional[str] = None) -> list:
    """The command line running ``python -P -m module args...``.  Returns a new list of str."""
    return python_cmd("-m", module, *args, executable=executable)


def child_env(extra: Optional[Mapping[str, str]] = None, base: Optional[Mapping[str, str]] = None) -> dict:
    """A child's environment: ``base`` (default ``os.environ``) plus ``extra``, with
    ``PYTHONSAFEPATH=1``.  Returns a new dict."""
    env = dict(os.environ if base is None else base)
    if extra:
        env.update(extra)
    env[SAFE_PATH_ENV] = "1"
    return env


def use_safe_path_for_children() -> None:
    """Set ``PYTHONSAFEPATH=1`` in this process's environment, so that every Python process it
    starts later without :func:`python_argv` (Spark's Python workers, started by the JVM
    this process launches) imports the installed ``rmq`` whatever the current directory is.
    This process's own ``sys.path`` is not changed."""
    os.environ[SAFE_PATH_ENV] = "1"
