"""glibc malloc settings for processes that move large, short-lived buffers.

Every pull answer, send batch and decoded page is a buffer of 100 KiB - 4 MiB that lives for a
few hundred microseconds.  With glibc's defaults such a buffer is either its own ``mmap`` (above
``M_MMAP_THRESHOLD``, 128 KiB at start) or, once the threshold has moved up, heap memory that
``free`` hands back to the kernel as soon as the free space at the top of the heap passes
``M_TRIM_THRESHOLD``.  Either way the next buffer faults its pages in again, zero-filled by the
kernel: on this project's 2-core machine that was about a third of the broker main thread's CPU
serving 1024-message pulls (``perf``: ``exc_page_fault``, ``clear_page_erms``,
``do_anonymous_page``, ``unmap_page_range``), and a fifth of a ``PullConsumer.poll_arrow``
client's.

:func:`tune_malloc` fixes both thresholds so those buffers are reused from the heap: buffers up
to ``MALLOC_MMAP_THRESHOLD_BYTES`` come from the heap, and up to ``MALLOC_TRIM_THRESHOLD_BYTES``
of free memory at the top of each heap stays mapped.  The cost is that bound of memory kept per
malloc arena after a burst.  rmq's actor processes call it when they start, and so do the clients
(``Producer``, the consumers, their ``rmq.aio`` twins) when they are made or started.

Opting out: ``RMQ_MALLOC_TUNING=0`` in the environment; glibc's own ``MALLOC_MMAP_THRESHOLD_`` /
``MALLOC_TRIM_THRESHOLD_`` variables, when set, win over these defaults (the setting they name
is left alone).  Nothing happens on a C library other than glibc (musl, macOS).
"""
from __future__ import annotations

import ctypes
import logging
import os
import platform
import threading

log = logging.getLogger("rmq.malloc")

MALLOC_MMAP_THRESHOLD_BYTES = 4 * 1024 * 1024    # above every pull page (maxTransferBytesOnMessageInMemory,
                                                 # 256 KiB); only a batch of the whole maxMessageSize maps
MALLOC_TRIM_THRESHOLD_BYTES = 16 * 1024 * 1024   # free heap top kept mapped, per arena
MALLOC_MMAP_THRESHOLD_MAX_BYTES = 32 * 1024 * 1024   # glibc's ceiling on 64-bit (HEAP_MAX_SIZE / 2)
TUNING_ENV = "RMQ_MALLOC_TUNING"                 # "0" / "false" / "off" / "no": leave malloc alone

# mallopt parameters, glibc <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
_GLIBC_ENV = {M_MMAP_THRESHOLD: "MALLOC_MMAP_THRESHOLD_", M_TRIM_THRESHOLD: "MALLOC_TRIM_THRESHOLD_"}
_NAMES = {M_MMAP_THRESHOLD: "M_MMAP_THRESHOLD", M_TRIM_THRESHOLD: "M_TRIM_THRESHOLD"}

_lock = threading.Lock()
_done: dict = {}                                  # pid -> what tune_malloc set in that process


def applied() -> "dict | None":
    """What :func:`tune_malloc` set in this process (its result), or None when it was not called."""
    with _lock:
        done = _done.get(os.getpid())
    return None if done is None else dict(done)


def tuning_disabled() -> bool:
    """Whether ``RMQ_MALLOC_TUNING`` turns the tuning off."""
    return os.environ.get(TUNING_ENV, "").strip().lower() in ("0", "false", "off", "no")


def _libc():
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None


def tune_malloc(mmap_threshold: int = MALLOC_MMAP_THRESHOLD_BYTES,
                trim_threshold: int = MALLOC_TRIM_THRESHOLD_BYTES) -> dict:
    """Set glibc's ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` for this process, once.

    Parameters
    ----------
    mmap_threshold : int
        Bytes; allocations at or above it get their own mapping.  1 .. 32 MiB
        (``MALLOC_MMAP_THRESHOLD_MAX_BYTES``, glibc's ceiling).
    trim_threshold : int
        Bytes of free memory at the top of a heap before ``free`` returns it to the kernel; >= 1.

    Returns
    -------
    dict
        ``{"M_MMAP_THRESHOLD": bytes, "M_TRIM_THRESHOLD": bytes}``: what this process runs with
        after the call (a setting left to its glibc environment variable is absent); empty when
        the tuning is off (``RMQ_MALLOC_TUNING=0``) or the C library is not glibc.  A second
        call in the same process changes nothing and returns the first call's result.

    Raises
    ------
    ValueError
        A threshold out of range (nothing is set).
    """
    if not isinstance(mmap_threshold, int) or not 1 <= mmap_threshold <= MALLOC_MMAP_THRESHOLD_MAX_BYTES:
        raise ValueError(f"mmap_threshold must be an int in [1, {MALLOC_MMAP_THRESHOLD_MAX_BYTES}] bytes, "
                         f"got {mmap_threshold!r}")
    if not isinstance(trim_threshold, int) or trim_threshold < 1:
        raise ValueError(f"trim_threshold must be an int >= 1 bytes, got {trim_threshold!r}")
    pid = os.getpid()                             # a forked child has its own malloc state to tune
    with _lock:
        if pid in _done:
            return dict(_done[pid])
        done: dict = {}
        libc = None if tuning_disabled() else _libc()
        if libc is not None:
            for param, value in ((M_MMAP_THRESHOLD, mmap_threshold), (M_TRIM_THRESHOLD, trim_threshold)):
                if os.environ.get(_GLIBC_ENV[param]):
                    continue                      # the user's glibc variable decides this one
                if libc.mallopt(param, value) == 1:
                    done[_NAMES[param]] = value
                else:
                    log.warning("mallopt(%s, %d) refused; malloc keeps its default", _NAMES[param], value)
        _done[pid] = done
        if done:
            log.debug("malloc tuned: %s", done)
        return dict(done)
