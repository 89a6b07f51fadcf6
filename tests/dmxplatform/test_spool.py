"""The spool against real Redis: what a process could not hand to Redis is appended once it can,
its own file's and dead processes' files, never a live process's; a line cut short is skipped."""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import subprocess
import sys

import pytest

from dmxplatform import spool as spool_module
from dmxplatform.redis_client import request_resp_client, rkey, sync_redis
from dmxplatform.resp import RedisUnavailable, RespClient
from dmxplatform.spool import ACTIVE, READY, Spool, replay

# Their Redis keys are their own (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("private_redis")

FIELD = b"e"


def run_replay(spool: Spool, redis: RespClient | None = None) -> int:
    async def main() -> int:
        client = redis or request_resp_client()
        try:
            return await replay(spool, client, field=FIELD)
        finally:
            await client.close()

    return asyncio.run(main())


def stream() -> str:
    return rkey("spool-test", "stream")


def entries() -> list[bytes]:
    return [fields[FIELD] for _, fields in sync_redis().xrange(stream())]


def test_spooled_entries_reach_their_stream_once_and_the_file_goes(tmp_path):
    spool = Spool(tmp_path)
    spool.append([(stream(), b'{"n": 1}'), (stream(), b'{"n": 2}')])
    spool.append([(stream(), b'{"n": 3}')])
    assert spool.pending()
    assert run_replay(spool) == 3
    assert entries() == [b'{"n": 1}', b'{"n": 2}', b'{"n": 3}']
    assert not spool.pending()
    assert run_replay(spool) == 0  # nothing twice
    spool.append([(stream(), b'{"n": 4}')])  # appends go on, to a new file
    assert run_replay(spool) == 1
    assert entries()[-1] == b'{"n": 4}'
    spool.close()


def test_a_line_cut_short_by_a_crash_is_skipped_and_the_rest_replayed(tmp_path):
    dead = tmp_path / f"host-1-1{ACTIVE}"
    dead.write_bytes(
        b'{"stream": "' + stream().encode() + b'", "payload": "{\\"n\\": 1}"}\n{"stream": "x", "pa'
    )
    spool = Spool(tmp_path)
    assert run_replay(spool) == 1
    assert entries() == [b'{"n": 1}']
    assert not dead.exists() and not list(tmp_path.glob(f"*{READY}"))


def test_a_live_process_keeps_its_file_and_a_dead_ones_is_taken_over(tmp_path):
    """Another gateway on the host holds its file's lock while it lives."""
    theirs = tmp_path / f"other-2-2{ACTIVE}"
    theirs.write_bytes(b'{"stream": "' + stream().encode() + b'", "payload": "{\\"n\\": 9}"}\n')
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1]); "
            "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)",
            str(theirs),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline().strip() == b"locked"
        spool = Spool(tmp_path)
        assert run_replay(spool) == 0
        assert theirs.exists()
    finally:
        holder.kill()
        holder.wait()
    assert run_replay(spool) == 1  # its process is gone: this one appends for it
    assert entries() == [b'{"n": 9}']


def test_a_redis_error_leaves_the_file_for_the_next_try(tmp_path):
    spool = Spool(tmp_path)
    spool.append([(stream(), b'{"n": 1}')])

    with socket.socket() as unused:  # a port nobody listens on: Redis is away
        unused.bind(("127.0.0.1", 0))
        away = RespClient(f"redis://127.0.0.1:{unused.getsockname()[1]}", timeout=1.0)
    with pytest.raises(RedisUnavailable):
        run_replay(spool, away)
    assert spool.pending()
    assert run_replay(spool) == 1
    assert entries() == [b'{"n": 1}']


def test_a_process_holds_the_lock_on_its_own_file(tmp_path):
    spool = Spool(tmp_path)
    spool.append([(stream(), b"{}")])
    (mine,) = tmp_path.glob(f"*{ACTIVE}")
    fd = os.open(mine, os.O_RDONLY)
    try:
        assert not spool_module._lock(fd)  # another open file: refused while this one lives
    finally:
        os.close(fd)
    spool.close()
    fd = os.open(mine, os.O_RDONLY)
    try:
        assert spool_module._lock(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def test_a_write_the_disk_cuts_short_is_an_error_and_spoils_no_other_line(tmp_path, monkeypatch):
    """A full disk took half a line: that record is not kept (the caller logs it instead), and
    the next one, written once the disk has room, is still read back whole."""
    spool = Spool(tmp_path)
    real_write = os.write
    calls = {"n": 0}

    def half_then_full(fd, data):
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spool_module.os, "write", half_then_full)
    with pytest.raises(OSError):
        spool.append([(stream(), b'{"lost": true}')])
    monkeypatch.undo()
    spool.append([(stream(), b'{"kept": true}')])
    assert run_replay(spool) == 1
    assert entries() == [b'{"kept": true}']
