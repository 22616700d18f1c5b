"""The HA epoch a consumer's position was read in, per queue (rmq; Kafka's position validation,
KIP-320): what rmq's consumers (``rmq.client.consumer_api.ConsumerCalls``) and the remoting proxy
(for RocketMQ's clients, ``rmq.proxy.server``) send back as ``lastEpoch``.

Every pull answer carries ``brokerEpoch`` and ``nextBeginOffset``.  A pull from exactly that
position, or a commit of an offset within it, carries that epoch; a broker whose log left the
epoch behind then moves a position read in the lost tail back to where the new epoch begins
(``PullMessageProcessor.past_epoch_end``) or stores a commit there
(``ConsumerManageProcessor.on_update_consumer_offset``).  A position from anywhere else (a
committed offset loaded when a rebalance brings the queue back, a seek, a reset) carries none:
an old epoch sent with it would move it back for nothing.
"""
from __future__ import annotations

from typing import Hashable, Optional


class PullEpochs:
    """``key -> (brokerEpoch, nextBeginOffset)`` of the last pull answer of each queue (``key``:
    whatever names the queue for the owner).  ``limit`` > 0: at that many queues the one answered
    longest ago is forgotten (0: no limit).  Not thread-safe beyond the GIL's single dict steps."""

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit
        self._last: dict = {}

    def __len__(self) -> int:
        return len(self._last)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._last

    def last(self, key: Hashable) -> Optional[tuple]:
        """``(epoch, next offset)`` of the last answer of ``key``, or None."""
        return self._last.get(key)

    def note(self, key: Hashable, epoch: object, next_offset: object) -> None:
        """A pull answer of ``key``: kept when both are ints (an answer without them changes nothing)."""
        if type(epoch) is not int or type(next_offset) is not int:
            return
        last = self._last
        if key in last:
            del last[key]                  # re-inserted last: the dict keeps answer order
        elif self.limit and len(last) >= self.limit:
            del last[next(iter(last))]
        last[key] = (epoch, next_offset)

    def for_pull(self, key: Hashable, offset: int) -> int:
        """The epoch to send with a pull of ``key`` from ``offset``: the last answer's when
        ``offset`` is the position it gave, else 0 (none)."""
        last = self._last.get(key)
        return last[0] if last is not None and last[1] == offset else 0

    def for_commit(self, key: Hashable, offset: int) -> int:
        """The epoch to send with a commit of ``offset``: the last answer's when ``offset`` is
        within the position it gave, else 0 (none)."""
        last = self._last.get(key)
        return last[0] if last is not None and offset <= last[1] else 0

    def forget(self, key: Hashable) -> None:
        """``key``'s position is the caller's now (a seek): no epoch goes with it."""
        self._last.pop(key, None)
