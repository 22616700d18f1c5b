"""The whole rmq exception tree (STYLE.md §7.7).

Every error message carries the values involved (file, position, expected,
found) so that a log line alone tells what went wrong.
"""


class RmqError(Exception):
    """Base of every rmq error."""


class StoreError(RmqError):
    """A failure of the message store (files, recovery, limits)."""


class StoreClosedError(StoreError):
    """The store, or one of its mapped files, is already shut down."""


class StoreDiskFullError(StoreError):
    """A file could not be allocated: the disk (or quota) is full."""


class StoreLockedError(StoreError):
    """Another process holds the store directory's ``lock`` file."""


class StoreCorruptionError(StoreError):
    """Data below the durable point (already fsync'd, possibly acknowledged) is damaged.

    Recovery refuses to start instead of truncating it away: repair the named
    file (e.g. from a replica) or move the store aside.

    Attributes
    ----------
    file_name : str
        The damaged file.
    position : int
        Byte position of the first bad record within ``file_name``.
    physical_offset, durable_offset : int
        Where that is in the log, and the durable offset recorded by the
        checkpoint (bytes).
    """

    def __init__(self, message: str, file_name: str = "", position: int = -1,
                 physical_offset: int = -1, durable_offset: int = -1):
        super().__init__(message)
        self.file_name = file_name
        self.position = position
        self.physical_offset = physical_offset
        self.durable_offset = durable_offset


class CorruptRecordError(StoreError, ValueError):
    """A CommitLog record failed its magic, length or CRC checks."""


class MessageIllegalError(StoreError, ValueError):
    """A message breaks a limit or a naming rule (RocketMQ MESSAGE_ILLEGAL).

    Attributes
    ----------
    status : str
        The PutMessageStatus name (``MESSAGE_ILLEGAL`` or ``PROPERTIES_SIZE_EXCEEDED``).
    """

    def __init__(self, message: str, status: str = "MESSAGE_ILLEGAL"):
        super().__init__(message)
        self.status = status


class BatchTooLargeError(MessageIllegalError):
    """A batch that cannot be stored whole: over maxMessageSize, or more than one CommitLog file
    holds (MESSAGE_ILLEGAL).

    Attributes
    ----------
    max_body : int
        The largest batch body (bytes) the store takes: what a producer that made the batch
        itself may split it into (rmq.common.request_header.MAX_BATCH_BYTES_FIELD).
    """

    def __init__(self, message: str, max_body: int):
        super().__init__(message)
        self.max_body = max_body


class IndexOverflowError(StoreError):
    """An IndexFile is full; the caller rolls to a new one."""


class FilterExpressionError(RmqError, ValueError):
    """A message filter expression (SQL92 or TAG) does not parse or breaks a rule.

    Attributes
    ----------
    expression : str
        The expression as given.
    position : int
        0-based character index of the offending token in ``expression``, or -1.
    line, column : int
        1-based line and column of ``position`` (0 when unknown).
    """

    def __init__(self, message: str, expression: str = "", position: int = -1, line: int = 0, column: int = 0):
        super().__init__(message)
        self.expression = expression
        self.position = position
        self.line = line
        self.column = column


class MQClientError(RmqError):
    """A client-side failure (RocketMQ MQClientException).

    Attributes
    ----------
    response_code : int
        RocketMQ ResponseCode when the failure came from a server, else -1.
    remark : str
    """

    def __init__(self, remark: str, response_code: int = -1):
        super().__init__(f"CODE: {response_code} DESC: {remark}" if response_code >= 0 else remark)
        self.response_code = response_code
        self.remark = remark


class SendManyError(MQClientError):
    """Some messages of one ``send_async_many`` call failed (the others are stored).

    Attributes
    ----------
    results : list
        One entry per message, in the order given: its ``SendResult``, or the exception it
        failed with.
    failed : int
        How many entries are exceptions (>= 1).  ``__cause__`` is the first of them.
    """

    def __init__(self, remark: str, results: list, failed: int):
        super().__init__(remark)
        self.results = results
        self.failed = failed


class MQBrokerError(MQClientError):
    """The broker answered with an error code (RocketMQ MQBrokerException)."""

    def __init__(self, remark: str, response_code: int, broker_addr: str = ""):
        super().__init__(remark, response_code)
        self.broker_addr = broker_addr


class RemotingError(MQClientError):
    """The request could not be sent or answered (RocketMQ RemotingException)."""


class RemotingTimeoutError(RemotingError):
    """No response within the timeout (RocketMQ RemotingTimeoutException)."""


class RemotingConnectionClosedError(RemotingTimeoutError):
    """The connection dropped with the request in flight: no answer will come.  Raised at once
    instead of at the timeout; a :class:`RemotingTimeoutError`, so code that treats "no answer"
    alike (retry elsewhere, the next NameServer) needs nothing new."""
