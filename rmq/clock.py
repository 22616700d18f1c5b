"""One clock interface for every rmq timer and timestamp (RELIABILITY.md T7).

Two readings, never mixed up:

* ``now_ms()``: the wall clock in milliseconds since the epoch.  Use it only for
  what is *stored or shown* as a date (store timestamps, file ages compared with
  file mtimes, the ``deleteWhen`` hour).  It can jump: NTP steps, ``date -s``, a
  VM resumed from a snapshot.
* ``monotonic()``: seconds from an arbitrary origin, never going back and never
  stepped.  Use it for every *interval*: timeouts, liveness (NameServer broker
  expiry), timer deadlines, and to detect wall-clock jumps.

Components take a ``Clock`` (default :data:`SYSTEM_CLOCK`) so tests can move the
wall clock (``time-machine``; it patches ``time.time`` but not ``time.monotonic``,
which is exactly a wall-clock step) without mocking the component.

:class:`WallJumpDetector` compares the two readings: between two observations
the wall clock should advance by what the monotonic clock advanced (plus a small
NTP slew); a larger difference is a step of the wall clock.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

CLOCK_JUMP_THRESHOLD_MS = 10 * 60 * 1000     # a wall step larger than this (10 min) is a "jump": warn, act


class Clock:
    """The system clocks (subclass to shift or freeze them in a test harness)."""

    def now_ms(self) -> int:
        """Wall clock, ms since the epoch (``time.time``; may jump)."""
        return int(time.time() * 1000)

    def monotonic(self) -> float:
        """Monotonic clock, seconds (``time.monotonic``; never jumps)."""
        return time.monotonic()


SYSTEM_CLOCK = Clock()


@dataclass
class WallJump:
    """One detected wall-clock step."""
    at_wall_ms: int        # wall time when it was detected (after the step)
    before_wall_ms: int    # wall time of the previous observation (before the step)
    delta_ms: int          # > 0: the wall clock jumped forward; < 0: backward


class WallJumpDetector:
    """Detects wall-clock steps by comparing wall and monotonic progress between observations.

    ``observe()`` returns the :class:`WallJump` seen since the previous
    observation (``|delta| > threshold_ms``) or None.  Every forward step is kept
    in ``forward_jumps`` so a caller can correct wall-clock ages of things
    stamped before the step (:meth:`forward_shift_after`).
    """

    def __init__(self, clock: Clock = SYSTEM_CLOCK, threshold_ms: int = CLOCK_JUMP_THRESHOLD_MS):
        self.clock = clock
        self.threshold_ms = threshold_ms
        self.forward_jumps: list[WallJump] = []
        self.jumps: list[WallJump] = []
        self._last: Optional[tuple[int, float]] = None
        self.observe()

    def observe(self) -> Optional[WallJump]:
        wall = self.clock.now_ms()
        mono = self.clock.monotonic()
        last, self._last = self._last, (wall, mono)
        if last is None:
            return None
        delta = (wall - last[0]) - int(round((mono - last[1]) * 1000.0))
        if abs(delta) <= self.threshold_ms:
            return None
        j = WallJump(wall, last[0], delta)
        self.jumps.append(j)
        if delta > 0:
            self.forward_jumps.append(j)
        return j

    def forward_shift_after(self, stamp_ms: int) -> int:
        """Total forward wall steps detected after a wall timestamp ``stamp_ms`` (ms): how much
        ``now - stamp_ms`` overstates the real age.  A step is counted when ``stamp_ms`` is before
        the observation that detected it (a stamp taken between the step and its detection is
        treated as before it: the age is understated, never overstated)."""
        return sum(j.delta_ms for j in self.forward_jumps if stamp_ms < j.at_wall_ms)
