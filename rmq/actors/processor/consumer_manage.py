"""ConsumerManageProcessor: GET_CONSUMER_LIST_BY_GROUP (38), QUERY_CONSUMER_OFFSET (14) and
UPDATE_CONSUMER_OFFSET (15).

Source: RocketMQ ``broker/.../processor/ConsumerManageProcessor.java``; SPEC.md §14 (offsets).
"""
from __future__ import annotations

from rmq.actors.actor import Reply
from rmq.actors.processor import RequestProcessor
from rmq.common.topic_validator import MAX_QUEUE_NUMS, check_group, check_topic
from rmq.protocol import Frame, ResponseCode, field_int, field_str, pack_body

MAX_QUEUE_OFFSET = 2 ** 63 - 1               # queue offsets are Java longs


class ConsumerManageProcessor(RequestProcessor):

    def on_consumer_list(self, frame: Frame, reply: Reply) -> Frame:
        """Body ``{"consumerIdList": [clientId]}`` of the group's live consumers (the rebalance's
        input); SYSTEM_ERROR when there is none."""
        group = field_str(frame, "consumerGroup")
        members = self.b.client_manager.consumer_table.get(group)
        if not members:
            return frame.response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return frame.response(bodies=[pack_body({"consumerIdList": sorted(members)})])

    def on_query_consumer_offset(self, frame: Frame, reply: Reply) -> Frame:
        store = self.b.store
        group, topic = field_str(frame, "consumerGroup"), field_str(frame, "topic")
        queue_id = field_int(frame, "queueId", lo=0, hi=MAX_QUEUE_NUMS - 1)
        off = store.consumer_offset_manager.query_offset(group, topic, queue_id)
        if off >= 0:
            return frame.response(fields={"offset": off})
        # RocketMQ: no committed offset yet and the queue still starts at 0 -> 0, else QUERY_NOT_FOUND
        if store.get_min_offset_in_queue(topic, queue_id) <= 0:
            return frame.response(fields={"offset": 0})
        return frame.response(ResponseCode.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")

    def on_update_consumer_offset(self, frame: Frame, reply: Reply) -> Frame:
        """Store ``commitOffset`` as the group's offset of the queue (either way: a reset moves it
        back).  ``lastEpoch`` (rmq, optional): the ``brokerEpoch`` of the consumer's last pull
        answer of the queue; an offset read in a tail this log lost in a failover is stored as the
        queue offset where the newer epochs begin (:meth:`lost_tail_start`), so that the consumer
        that next takes the queue over does not skip the messages stored there since.  Bad
        fields: SYSTEM_ERROR naming the field, nothing stored."""
        group, topic = field_str(frame, "consumerGroup"), field_str(frame, "topic")
        check_group(group)
        queue_id = field_int(frame, "queueId", lo=0, hi=MAX_QUEUE_NUMS - 1)
        off = field_int(frame, "commitOffset", lo=0, hi=MAX_QUEUE_OFFSET)
        last_epoch = field_int(frame, "lastEpoch", 0, lo=0)
        check_topic(topic)
        end = self.lost_tail_start(topic, queue_id, last_epoch)
        if end is not None and off > end:
            self.log.warning("commit of %s:%d by %s at queue offset %d, read in epoch %d: this log's epoch %d "
                             "starts at queue offset %d (messages lost in a failover): stored as %d",
                             topic, queue_id, group, off, last_epoch, self.b.epochs.last_epoch(), end, end)
            off = end
        self.b.store.consumer_offset_manager.commit_offset(group, topic, queue_id, off)
        return frame.response()
