"""EndTransactionProcessor: END_TRANSACTION (37), one-way from a transactional producer, or its
answer to CHECK_TRANSACTION_STATE (``fromTransactionCheck``).

Source: RocketMQ ``broker/.../processor/EndTransactionProcessor.java``; SPEC.md §11.3.  The state
(pending transactions, op records, check-back) is the TransactionService's
(:mod:`rmq.actors.transaction`, RocketMQ's TransactionalMessageService).
"""
from __future__ import annotations

from typing import Optional

from rmq.actors.actor import Reply
from rmq.actors.processor import RequestProcessor
from rmq.actors.transaction import COMMIT_OR_ROLLBACK
from rmq.protocol import Frame, ResponseCode, field_int, field_str

TRANSACTION_NOT_TYPE = 0                     # MessageSysFlag: the producer does not know the outcome yet


class EndTransactionProcessor(RequestProcessor):

    def on_end_transaction(self, frame: Frame, reply: Reply) -> Optional[Frame]:
        """Header ``producerGroup, tranStateTableOffset, commitLogOffset, commitOrRollback (0 / 8 /
        12), fromTransactionCheck, msgId, transactionId``.

        A slave answers SLAVE_NOT_AVAILABLE; TRANSACTION_NOT_TYPE (0) is ignored without a
        response; another value of ``commitOrRollback`` gets SYSTEM_ERROR; the rest is
        :meth:`rmq.actors.transaction.TransactionService.end_transaction`.
        """
        b = self.b
        if b.role not in ("ASYNC_MASTER", "SYNC_MASTER"):
            return frame.response(ResponseCode.SLAVE_NOT_AVAILABLE, "Can't commit or rollback transaction on a slave")
        group = field_str(frame, "producerGroup", max_len=255)
        what = field_int(frame, "commitOrRollback", 0)
        phys = field_int(frame, "commitLogOffset", lo=0)
        qo = field_int(frame, "tranStateTableOffset", -1)
        if what == TRANSACTION_NOT_TYPE:
            return None
        outcome = COMMIT_OR_ROLLBACK.get(what)
        if outcome is None:
            return frame.response(ResponseCode.SYSTEM_ERROR, f"commitOrRollback {what} is not 0, 8 or 12")
        return b.tx.end_transaction(frame, reply, group, phys, qo, outcome)
