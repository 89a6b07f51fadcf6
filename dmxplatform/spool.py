"""Stream entries a process could not hand to Redis, kept in a local append-only file and put on
their streams once Redis is back, by the process itself: no person in the loop.

Each process appends to a file of its own in DMX_SPOOL_DIR and holds an exclusive lock on it
while it lives. Replaying, a process first renames its own file out of the way (and starts a
new one), and takes over the file of any process whose lock is gone (it died); every renamed file
is locked while it is replayed, appended to Redis and then deleted. A file replayed twice (a
crash between appending and deleting) is harmless: the streams' consumers store each entry once
on its natural key (a usage event's request id).

A write is one `write(2)` of one line to a file opened O_APPEND, without fsync: it survives a
crash of the process (the kernel has it), not one of the host; fsync would put a disk flush on
the event loop for every request served while Redis is away.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import socket
import time
from pathlib import Path

import orjson

from dmxplatform.resp import ClusterRespClient, RespClient

logger = logging.getLogger(__name__)

ACTIVE = ".spool"
READY = ".ready"
# Entries appended to Redis per pipeline while replaying.
REPLAY_BATCH = 500


def _lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


class Spool:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fd: int | None = None
        self._path: Path | None = None
        self._torn = False  # a write failed partway: the file may end in half a line
        self.appended = 0  # since this process started, for tests and logs

    def _own(self) -> int:
        if self._fd is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            name = f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}{ACTIVE}"
            self._path = self.directory / name
            fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            _lock(fd)  # a new file: nobody else holds it
            self._fd = fd
        return self._fd

    def append(self, entries: list[tuple[str, bytes]]) -> None:
        """Keep (stream key, payload) entries for a later replay; raises OSError when the disk
        will not take all of them."""
        lines = b"".join(
            orjson.dumps({"stream": key, "payload": payload.decode()}) + b"\n"
            for key, payload in entries
        )
        if self._torn:
            lines = b"\n" + lines  # the last write stopped mid-line: end that line first
        fd = self._own()
        view = memoryview(lines)
        while view:
            try:
                written = os.write(fd, view)
            except OSError:
                self._torn = True
                raise
            if not written:
                self._torn = True
                raise OSError("the spool file takes no more")
            view = view[written:]
        self._torn = False
        self.appended += len(entries)

    def pending(self) -> bool:
        """Whether any spool file in the directory holds something (cheap: one directory read)."""
        try:
            return any(
                entry.name.endswith((ACTIVE, READY)) and entry.stat().st_size
                for entry in os.scandir(self.directory)
            )
        except FileNotFoundError:
            return False

    def take(self) -> list[Path]:
        """Set aside every file to replay: this process's own (a new one takes its appends) and
        those of dead processes; return the set-aside files, oldest first."""
        if self._fd is not None and self._path is not None and os.fstat(self._fd).st_size:
            os.rename(self._path, self._path.with_suffix(READY))
            os.close(self._fd)
            self._fd = self._path = None
        for path in self.directory.glob(f"*{ACTIVE}"):
            with contextlib.suppress(FileNotFoundError):
                fd = os.open(path, os.O_RDONLY)
                try:
                    if _lock(fd):  # its process is gone
                        os.rename(path, path.with_suffix(READY))
                finally:
                    os.close(fd)
        return sorted(self.directory.glob(f"*{READY}"), key=lambda p: p.stat().st_mtime)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_entries(path: Path) -> tuple[list[tuple[str, bytes]], int]:
    """The (stream key, payload) entries of a spool file, and how many lines were unreadable
    (a line cut short by a crash mid-write)."""
    entries, unreadable = [], 0
    for line in path.read_bytes().splitlines():
        if not line:
            continue
        try:
            record = orjson.loads(line)
            entries.append((record["stream"], record["payload"].encode()))
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            unreadable += 1
    return entries, unreadable


async def replay(spool: Spool, redis: RespClient | ClusterRespClient, *, field: bytes) -> int:
    """Append every spooled entry to its stream (as `field`); return how many. Stops at the
    first Redis error, leaving what is not done for the next call."""
    done = 0
    for path in spool.take():
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue  # another process replayed it meanwhile
        try:
            if not _lock(fd):
                continue  # another process replays it now
            # A long outage's file can hold hundreds of MB: read and parsed off the event loop.
            entries, unreadable = await asyncio.to_thread(read_entries, path)
            for start in range(0, len(entries), REPLAY_BATCH):
                # Issued together, the batch leaves in one write per Redis node.
                await asyncio.gather(
                    *(
                        redis.execute(b"XADD", key, b"*", field, payload)
                        for key, payload in entries[start : start + REPLAY_BATCH]
                    )
                )
            path.unlink()
            done += len(entries)
            if unreadable:
                logger.error("%s: %d unreadable spool lines dropped", path.name, unreadable)
            logger.warning("replayed %d spooled stream entries from %s", len(entries), path.name)
        finally:
            os.close(fd)
    return done
