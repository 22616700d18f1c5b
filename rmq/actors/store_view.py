"""What the reput and flush actors open of a store the broker recovered: the
CommitLog as a reader, the ConsumeQueues and IndexFiles, and the checkpoint."""
from __future__ import annotations

import os

from rmq.store.checkpoint import StoreCheckpoint
from rmq.store.config import MessageStoreConfig
from rmq.store.consume_queue import ConsumeQueue
from rmq.store.index_service import IndexService
from rmq.store.mapped_file_queue import MappedFileQueue


class StoreView:
    """Files of one store, opened without recovery (the broker ran it) and without the lock."""

    def __init__(self, config: MessageStoreConfig):
        self.config = config
        self.root = os.path.abspath(config.store_path_root_dir)
        self.commitlog = MappedFileQueue(config.store_path_commit_log or os.path.join(self.root, "commitlog"),
                                         config.mapped_file_size_commit_log)
        self.commitlog.load(drop_tmp=False)      # the broker's allocator may be creating the next file
        for mf in self.commitlog.files:          # nothing is readable until the broker announces it
            mf.wrote_position = 0
        self.consume_queue_table: dict[tuple[str, int], ConsumeQueue] = {}
        cq_root = os.path.join(self.root, "consumequeue")
        if os.path.isdir(cq_root):
            for topic in sorted(os.listdir(cq_root)):
                tdir = os.path.join(cq_root, topic)
                if not os.path.isdir(tdir):
                    continue
                for qid in sorted(os.listdir(tdir)):
                    if qid.isdigit():
                        cq = self.find_consume_queue(topic, int(qid))
                        cq.recover()
        self.index_service = IndexService(os.path.join(self.root, "index"), config.max_hash_slot_num,
                                          config.max_index_num, config.message_index_enable,
                                          config.max_msgs_num_batch, on_file_full=self._on_index_file_full)
        self.index_service.load(True, 0)
        self.checkpoint = StoreCheckpoint(os.path.join(self.root, "checkpoint"))

    def _on_index_file_full(self, end_timestamp: int) -> None:
        self.checkpoint.index_msg_timestamp = end_timestamp
        self.checkpoint.flush()

    def find_consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self.consume_queue_table.get(key)
        if cq is None:
            cq = ConsumeQueue(self.root, topic, queue_id, self.config.mapped_file_size_consume_queue)
            cq.load()
            self.consume_queue_table[key] = cq
        return cq

    def max_physic_offset_of_consume_queues(self) -> int:
        return max((cq.get_max_physic_offset() for cq in self.consume_queue_table.values()), default=0)

    def close(self) -> None:
        for cq in self.consume_queue_table.values():
            cq.shutdown()
        for f in self.index_service.files:
            f.close()
        for mf in self.commitlog.files:
            mf.close()
        self.checkpoint._file.close()
