"""The broker's request processors (RocketMQ ``broker/src/main/java/.../broker/processor/``).

The broker actor (:class:`rmq.actors.broker.BrokerActor`, RocketMQ's ``BrokerController``) owns the
store, the role and the tables; each processor here answers the request codes of one concern and
reaches the broker's state through ``self.b``.  The actor registers every handler by code in one
table (``BrokerActor.register_processors``, RocketMQ's ``registerProcessor``).

Handler contract (``rmq.actors.actor``): ``handler(frame, reply) -> Frame | None``; a Frame is the
response, None means "answered later through ``reply``" (a held pull, a parked sync send) or no
response at all (a one-way request).  A :class:`~rmq.protocol.ProtocolError` raised by a handler
becomes its code and remark; any other exception becomes SYSTEM_ERROR and the broker keeps serving.

=====================================  ===============================================================
module                                 RocketMQ counterpart
=====================================  ===============================================================
:mod:`.send`                           SendMessageProcessor (send, batch send, consumerSendMsgBack) and
                                       the sends parked for a flush or a slave (GroupCommit waits)
:mod:`.pull`                           PullMessageProcessor and PullRequestHoldService
:mod:`.query`                          QueryMessageProcessor
:mod:`.admin`                          AdminBrokerProcessor (topics, groups, offsets, broker config,
                                       runtime info, stats, queue locks)
:mod:`.client_manage`                  ClientManageProcessor with ProducerManager / ConsumerManager
:mod:`.consumer_manage`                ConsumerManageProcessor (consumer list, consumer offsets)
:mod:`.end_transaction`                EndTransactionProcessor
:mod:`.ha`                             rmq: the ha actor's reports, replicated appends, promotion
                                       (RocketMQ's HAService hooks and SlaveSynchronize)
:mod:`.store_announce`                 rmq: the reput / flush / cleaner actors' announcements
=====================================  ===============================================================

POP (:mod:`rmq.actors.pop`), transactions (:mod:`rmq.actors.transaction`) and timers
(:mod:`rmq.actors.timer`) are services with state of their own; their request handlers are
registered in the same table.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # pragma: no cover
    from rmq.actors.broker import BrokerActor

VERSION = "rmq-0.1"                          # the broker's version in runtime info and connection lists


class RequestProcessor:
    """Base of a processor: ``self.b`` is the broker actor whose state it serves."""

    def __init__(self, broker: "BrokerActor"):
        self.b = broker

    @property
    def log(self):
        return self.b.log

    def lost_tail_start(self, topic: str, queue_id: int, last_epoch: int) -> Optional[int]:
        """The queue offset where the HA epochs after ``last_epoch`` begin in this broker's log, or
        None when there is nothing to check (rmq; Kafka's offset validation, KIP-320).

        ``last_epoch``: the ``brokerEpoch`` of the pull answer that gave a consumer its position
        (sent back as ``lastEpoch``).  When the log holds a newer epoch, starting at CommitLog byte
        S, the consumer saw at most the entries stored before S: a position (or a commit) past the
        returned queue offset was read in a tail that a failover lost, and the messages stored at
        those queue offsets since are others.  None when ``last_epoch`` is 0 or current, when
        reput has not dispatched past S yet (undecided) or the queue has no ConsumeQueue here."""
        b = self.b
        epochs = b.epochs
        if last_epoch <= 0 or last_epoch >= epochs.last_epoch():
            return None
        start = epochs.start_offset_after(last_epoch)
        if start < 0 or b.dispatched_offset < start:
            return None
        cq = b.store.find_consume_queue(topic, queue_id, create=False)
        if cq is None:
            return None
        return cq.offset_of_physical_offset(start)
