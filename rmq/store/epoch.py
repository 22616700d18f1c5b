"""Epoch file: which master epoch wrote which range of the CommitLog (SPEC.md §9.5).

``<store root>/epochFileCheckpoint`` is RocketMQ 5.x's ``EpochFileCache``
checkpoint, a text file (layout: SPEC.md §9.5)::

    2                    number of entries
    1234567890           zlib.crc32 (decimal) of the entry lines
    1-0                  epoch-startOffset, one line per entry, oldest first
    2-1048576

Entry lines are joined with ``\\n`` (each followed by one) for the CRC.  Every
persist keeps the previous copy as ``epochFileCheckpoint.bak`` (tmp + fsync +
rename, then a directory fsync, like the JSON config files).

Epoch ``e`` covers CommitLog bytes ``[start_offset(e), start_offset(e+1))``;
the last epoch runs to the CommitLog's max offset.  :func:`find_consistent_point`
compares two brokers' entry lists to find how far their CommitLogs agree.
"""
from __future__ import annotations

import logging
import os
import zlib
from typing import NamedTuple, Optional, Sequence

from rmq.errors import StoreError

log = logging.getLogger(__name__)

EPOCH_FILE = "epochFileCheckpoint"
BAK_SUFFIX = ".bak"
TMP_SUFFIX = ".tmp"


class EpochFileError(StoreError):
    """The epoch file and its ``.bak`` are both unreadable (message names the files)."""


class EpochEntry(NamedTuple):
    """One epoch: its number and the physical offset (bytes) of its first CommitLog byte."""
    epoch: int
    start_offset: int


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def encode_entries(entries: Sequence[EpochEntry]) -> str:
    """The file's text for ``entries`` (layout: SPEC.md §9.5)."""
    body = "".join(f"{e.epoch}-{e.start_offset}\n" for e in entries)
    return f"{len(entries)}\n{zlib.crc32(body.encode('ascii'))}\n{body}"


def decode_entries(text: str) -> list[EpochEntry]:
    """Parse the file's text; raises ValueError on a bad size, CRC, line or order."""
    lines = text.split("\n")
    if len(lines) < 2:
        raise ValueError("fewer than 2 header lines")
    try:
        size = int(lines[0].strip())
        crc = int(lines[1].strip())
    except ValueError:
        raise ValueError(f"bad header {lines[:2]!r}") from None
    entry_lines = [ln.strip() for ln in lines[2:] if ln.strip()]
    if size < 0 or size != len(entry_lines):
        raise ValueError(f"size line says {size} entries, found {len(entry_lines)}")
    body = "".join(f"{ln}\n" for ln in entry_lines)
    actual = zlib.crc32(body.encode("ascii", "replace"))
    if actual != crc:
        raise ValueError(f"crc line says {crc}, entries have {actual}")
    out: list[EpochEntry] = []
    for ln in entry_lines:
        epoch_s, sep, start_s = ln.partition("-")
        if not sep or not epoch_s.isdigit() or not start_s.isdigit():
            raise ValueError(f"bad entry line {ln!r}")
        e = EpochEntry(int(epoch_s), int(start_s))
        if out and (e.epoch <= out[-1].epoch or e.start_offset < out[-1].start_offset):
            raise ValueError(f"entry {ln!r} does not follow {out[-1].epoch}-{out[-1].start_offset}")
        out.append(e)
    return out


class EpochFile:
    """The epoch checkpoint of one store (RocketMQ ``EpochFileCache``).

    Parameters
    ----------
    path : str
        ``<store root>/epochFileCheckpoint`` (see :data:`EPOCH_FILE`).

    Concurrency: one writer (the HA service); not thread-safe.
    """

    def __init__(self, path: str):
        self.path = os.fspath(path)
        self.entries: list[EpochEntry] = []

    # -- file --------------------------------------------------------------------
    def load(self) -> "EpochFile":
        """Read the file (missing: no entries); a bad size or CRC falls back to ``.bak``.

        Raises
        ------
        EpochFileError
            Both the file and its ``.bak`` exist but fail their checks (or the
            file fails and there is no ``.bak``).
        """
        bak = self.path + BAK_SUFFIX
        if not os.path.exists(self.path) and not os.path.exists(bak):
            self.entries = []
            return self
        errors = []
        for candidate in (self.path, bak):
            try:
                with open(candidate, "r", encoding="ascii", errors="replace") as f:
                    text = f.read()
            except FileNotFoundError:
                errors.append(f"{candidate}: missing")
                continue
            try:
                self.entries = decode_entries(text)
            except ValueError as e:
                errors.append(f"{candidate}: {e}")
                continue
            if candidate == bak:
                log.warning("epoch file %s unreadable (%s); loaded %s", self.path, errors[0], bak)
            return self
        raise EpochFileError(f"epoch file {self.path} is unreadable and so is its backup: " + "; ".join(errors))

    def persist(self) -> None:
        """Write the entries: tmp + fsync + rename, previous copy kept as ``.bak``, dir fsync."""
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        tmp = self.path + TMP_SUFFIX
        data = encode_entries(self.entries).encode("ascii")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(self.path):
            try:
                with open(self.path, "r", encoding="ascii", errors="replace") as f:
                    decode_entries(f.read())
                valid = True
            except ValueError:
                valid = False          # never let a damaged copy replace a good backup
            if valid:
                os.replace(self.path, self.path + BAK_SUFFIX)
        os.replace(tmp, self.path)
        _fsync_dir(directory)

    # -- entries -----------------------------------------------------------------
    def last_entry(self) -> Optional[EpochEntry]:
        return self.entries[-1] if self.entries else None

    def last_epoch(self) -> int:
        """The newest epoch number; 0 when there is none."""
        return self.entries[-1].epoch if self.entries else 0

    def append(self, epoch: int, start_offset: int) -> EpochEntry:
        """Add (and persist) a new epoch starting at ``start_offset`` (bytes).

        Raises
        ------
        ValueError
            ``epoch`` not above the last epoch, or ``start_offset`` below the
            last entry's start offset (or negative).
        """
        epoch, start_offset = int(epoch), int(start_offset)
        last = self.last_entry()
        if start_offset < 0:
            raise ValueError(f"start offset must be >= 0, got {start_offset}")
        if last is not None and epoch <= last.epoch:
            raise ValueError(f"epoch {epoch} must be above the last epoch {last.epoch}")
        if last is not None and start_offset < last.start_offset:
            raise ValueError(f"start offset {start_offset} below the last epoch's start {last.start_offset}")
        entry = EpochEntry(epoch, start_offset)
        self.entries.append(entry)
        self.persist()
        return entry

    def truncate_from(self, offset: int) -> int:
        """After the CommitLog was cut at ``offset`` (bytes): drop (and persist) every
        entry with ``start_offset >= offset`` -- it would describe no byte of the
        kept log (RocketMQ ``truncateSuffixByOffset``).  Returns entries dropped."""
        keep = [e for e in self.entries if e.start_offset < offset]
        dropped = len(self.entries) - len(keep)
        if dropped:
            self.entries = keep
            self.persist()
        return dropped

    def start_offset_after(self, epoch: int) -> int:
        """Start offset (bytes) of the first epoch newer than ``epoch``: where this log stops
        holding what a reader of ``epoch`` may have seen (Kafka's OffsetsForLeaderEpoch end
        offset); -1 when no newer epoch is in the file."""
        for e in self.entries:
            if e.epoch > epoch:
                return e.start_offset
        return -1

    def end_offset_of(self, epoch: int, max_offset: int) -> int:
        """End (bytes, exclusive) of ``epoch``: the next epoch's start offset, or
        ``max_offset`` for the last epoch; -1 when ``epoch`` is not in the file."""
        return _end_offset_of(self.entries, epoch, max_offset)


def _end_offset_of(entries: Sequence[EpochEntry], epoch: int, max_offset: int) -> int:
    for i, e in enumerate(entries):
        if e.epoch == epoch:
            return entries[i + 1].start_offset if i + 1 < len(entries) else max_offset
    return -1


def find_consistent_point(master_entries: Sequence[EpochEntry], master_max_offset: int,
                          slave_entries: Sequence[EpochEntry], slave_max_offset: int) -> int:
    """The physical offset (bytes) up to which the slave's CommitLog agrees with the master's.

    Assumes two logs agree within an epoch both have with the same start
    offset (one master wrote it).  Walks the slave's epochs from the newest;
    for the first one the master has with the same start offset, returns
    ``min(slave's end of it, master's end of it)`` (ends: next epoch's start,
    or the max offset for the last epoch).

    An empty list stands for an implicit epoch 0 starting at offset 0 (a store
    that never had an epoch), so two brokers that never failed over agree up
    to ``min(master_max_offset, slave_max_offset)``.

    Returns
    -------
    int
        The consistent point, or -1 when the logs share no epoch (no common
        prefix: the slave must drop its whole CommitLog and copy the master's
        from the master's min offset).
    """
    master = list(master_entries) or [EpochEntry(0, 0)]
    slave = list(slave_entries) or [EpochEntry(0, 0)]
    master_starts = {e.epoch: e.start_offset for e in master}
    for e in reversed(slave):
        if master_starts.get(e.epoch) == e.start_offset:
            return min(_end_offset_of(slave, e.epoch, slave_max_offset),
                       _end_offset_of(master, e.epoch, master_max_offset))
    return -1


# -- the CommitLog's lineage (rmq) -----------------------------------------------------------------
LOG_ID_FILE = "haLogId"                  # <store root>/haLogId: one line, the lineage id
LOG_ID_MAX_LEN = 64                      # characters; a longer line is not an id


def read_log_id(store_root: str) -> str:
    """The id of the CommitLog lineage this store belongs to (rmq; Kafka's ``cluster.id`` in
    ``meta.properties`` is the model), or "" when it has none yet.

    A master makes one when it first serves replicas (:func:`new_log_id`); a slave takes its
    master's at its first handshake and keeps it; the HA handshake refuses a peer of another
    lineage (``rmq.actors.ha``), so that a slave never cuts or extends its CommitLog from a log
    that is not its broker set's.

    Raises
    ------
    EpochFileError
        The file exists but does not hold an id (empty, too long, not one printable line).
    """
    path = os.path.join(store_root, LOG_ID_FILE)
    try:
        with open(path, "r", encoding="ascii") as f:
            text = f.read()
    except FileNotFoundError:
        return ""
    except (OSError, UnicodeDecodeError) as e:
        raise EpochFileError(f"{path}: unreadable: {e}") from None
    log_id = text.strip()
    if not log_id or len(log_id) > LOG_ID_MAX_LEN or not log_id.isprintable() or " " in log_id:
        raise EpochFileError(f"{path}: {text[:80]!r} is not a CommitLog lineage id")
    return log_id


def new_log_id() -> str:
    """A fresh lineage id: 32 hex digits (random)."""
    return os.urandom(16).hex()


def write_log_id(store_root: str, log_id: str) -> None:
    """Store ``log_id`` as this store's lineage (tmp + fsync + rename, then the directory fsync).

    Raises
    ------
    ValueError
        ``log_id`` is not an id (empty, over LOG_ID_MAX_LEN, spaces or unprintable).
    """
    if not log_id or len(log_id) > LOG_ID_MAX_LEN or not log_id.isprintable() or " " in log_id:
        raise ValueError(f"{log_id!r} is not a CommitLog lineage id")
    from rmq.store.config_manager import write_file_atomically
    write_file_atomically(os.path.join(store_root, LOG_ID_FILE), log_id + "\n")
