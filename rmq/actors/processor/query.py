"""QueryMessageProcessor: QUERY_MESSAGE (12, by key through the IndexFiles) and
VIEW_MESSAGE_BY_ID (33, by the physical offset an offset message id carries).

Source: RocketMQ ``broker/.../processor/QueryMessageProcessor.java``; SPEC.md §3.5 (IndexFile).
"""
from __future__ import annotations

import time

from rmq.actors.actor import Reply
from rmq.actors.processor import RequestProcessor
from rmq.protocol import Frame, ResponseCode, field_int, field_str

MAX_QUERY_NUM = 64                           # maxNum ceiling of one QUERY_MESSAGE (rmq limit)


class QueryMessageProcessor(RequestProcessor):

    def on_query_message(self, frame: Frame, reply: Reply) -> Frame:
        """Messages of ``topic`` whose key is ``key``, stored within [beginTimestamp, endTimestamp]
        (ms); body: the stored records back to back; QUERY_NOT_FOUND when there is none."""
        store = self.b.store
        topic = field_str(frame, "topic")
        key = field_str(frame, "key")
        max_num = field_int(frame, "maxNum", 32, lo=1, hi=MAX_QUERY_NUM)
        begin = field_int(frame, "beginTimestamp", 0)
        end = field_int(frame, "endTimestamp", int(time.time() * 1000) + 1000)
        store.reload_index_for_read()
        res = store.query_message(topic, key, max_num, begin, end)
        if not res.records:
            return frame.response(ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct")
        return frame.response(fields={"indexLastUpdateTimestamp": res.index_last_update_timestamp,
                                      "indexLastUpdatePhyoffset": res.index_last_update_phyoffset},
                              bodies=[b"".join(res.records)])

    def on_view_message_by_id(self, frame: Frame, reply: Reply) -> Frame:
        """The stored record at CommitLog ``offset`` (bytes) as the body."""
        offset = field_int(frame, "offset", lo=0)
        rec = self.b.store.select_one_message_by_offset(offset)
        if rec is None:
            return frame.response(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        return frame.response(bodies=[rec])
