"""The engine's whole process tree, owned by the worker: nothing of it outlives the worker.

vLLM's API server starts its engine core (and, on some platforms, workers and a resource
tracker) as children. Killed with -9, the API server leaves them running with the GPU memory
they hold; a worker killed with -9 leaves the API server serving on its port, so the next
worker's health check reaches the orphan. Hence:

- vLLM runs in a process group (and session) of its own, whose id is the API server's pid,
  written to the run directory, so that a later worker can find what an earlier one left;
- vLLM gets SIGTERM when the worker dies, however it dies (the parent-death signal, set by
  this module run as a launcher that then execs vLLM), and shuts its engine down as it does on
  any SIGTERM;
- every process of the tree carries the run directory in its environment, so that a later
  worker on that directory can tell what an earlier one left from anything else;
- the worker is a child subreaper: vLLM's children, orphaned by a dead API server, become the
  worker's, which signals and reaps the whole group on every exit path.

Linux only, like vLLM's serving stack (prctl, /proc).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import sys
import time
from pathlib import Path

# linux/prctl.h
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# How often a group being stopped is looked at, seconds.
POLL_SECONDS = 0.1
# SIGKILL takes effect at once except on a process stuck in the kernel (a hung GPU driver
# call): past this, stop waiting for it and say so.
KILL_WAIT_SECONDS = 10.0

_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, value, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def become_subreaper() -> None:
    """Adopt this process's orphaned descendants (vLLM's engine core when its API server dies),
    so that they can be signalled and reaped here instead of by init."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


def launch_argv(argv: list[str], *, nice: int = 0) -> list[str]:
    """`argv` run through this module: it sets the parent-death signal, lowers its CPU priority
    by `nice` (inherited by every process it starts), and execs `argv`.

    Not a Popen preexec_fn: that runs Python between fork and exec, unsafe in a parent with
    threads (the worker has them); here the prctl happens in a fresh interpreter, and survives
    the exec."""
    return [sys.executable, "-m", "inference.proctree", str(os.getpid()), str(nice), *argv]


def _launch(parent_pid: int, nice: int, argv: list[str]) -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:  # the parent died before the prctl: nobody to serve
        os._exit(1)
    if nice:
        os.nice(nice)
        if os.getsid(0) == os.getpid():
            _nice_autogroup(nice)
    os.execv(argv[0], argv)


def _nice_autogroup(nice: int) -> None:
    """Lower the CPU weight of this session's scheduler autogroup as well. With autogroups on
    (kernel.sched_autogroup_enabled, the default of most distributions' kernels) the CPU is
    shared between sessions first and a process's nice only ranks it within its own: the engine
    leads a session of its own, so its nice alone left it an equal share beside the gateway's
    and Redis's (a CI run's twelve long generations stalled both gateways' Redis reads past
    their timeout). Only a session leader gets here: any other would lower its parent's too."""
    for _ in range(20):
        try:
            Path("/proc/self/autogroup").write_text(str(nice))
            return
        except BlockingIOError:
            time.sleep(0.1)  # EAGAIN: the kernel takes one change per 100 ms, machine-wide
        except OSError:
            # No autogroups here (a kernel built without them), or none this process may set:
            # the process's own nice is all there is, and vLLM still starts.
            return


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, process group, state) of a process, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces or parentheses itself.
    fields = raw[raw.rindex(b")") + 2 :].split()
    return int(fields[1]), int(fields[2]), fields[0].decode()


def group_members(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes in a process group."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[1] == pgid and stat[2] != "Z":
                members.append(int(entry))
    return members


def has_environment(pid: int, entry: str) -> bool:
    """Whether a process was started with `entry` ("NAME=value") in its environment: children
    inherit it, so it marks a whole tree (vLLM retitles its processes, VLLM::EngineCore, and
    the interpreter's path says nothing)."""
    try:
        return entry.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _reap_adopted(keep: int | None) -> None:
    """Collect the exit status of descendants this subreaper adopted and that have exited; not
    `keep`'s, a child of our own whose Popen reads its status itself."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != keep:
            stat = _stat(int(entry))
            if stat is not None and stat[0] == me and stat[2] == "Z":
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(int(entry), os.WNOHANG)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    except PermissionError as exc:  # pragma: no cover - another user's group
        if exc.errno != errno.EPERM:
            raise


def stop_group(pgid: int, *, grace: float, keep: int | None = None) -> bool:
    """SIGTERM every process of a group, SIGKILL what is left after `grace` seconds, and wait
    until none is left; return whether any was found. `keep`: a child whose status Popen reads."""
    if not group_members(pgid):
        _reap_adopted(keep)
        return False
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while group_members(pgid) and time.monotonic() < deadline:
        _reap_adopted(keep)
        time.sleep(POLL_SECONDS)
    if group_members(pgid):
        _signal_group(pgid, signal.SIGKILL)
        deadline = time.monotonic() + KILL_WAIT_SECONDS
        while group_members(pgid) and time.monotonic() < deadline:
            _reap_adopted(keep)
            time.sleep(POLL_SECONDS)
    _reap_adopted(keep)
    left = group_members(pgid)
    if left:
        raise OSError(f"processes {left} of group {pgid} survive SIGKILL")
    return True


if __name__ == "__main__":
    # python -m inference.proctree PARENT_PID NICE ARGV...: see launch_argv.
    _launch(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
