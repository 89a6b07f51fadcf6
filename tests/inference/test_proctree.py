"""The engine's process tree, with plain processes standing in for vLLM's: the launcher's
parent-death signal, a group's orphans stopped and reaped, a tree told by its environment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from inference import proctree
from tests.stack import ROOT, wait_for

PYTHON = sys.executable


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    """Run a scenario in a process of its own: a subreaper changes the process that asks."""
    return subprocess.run(
        [PYTHON, "-c", script, *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def gone(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_launched_child_is_told_when_its_parent_dies_however_it_dies():
    """The worker killed with -9 leaves no vLLM serving: the launcher set SIGTERM as its
    child's parent-death signal before exec'ing it."""
    parent = subprocess.Popen(
        [
            PYTHON,
            "-c",
            "import subprocess, sys, time\n"
            "from inference import proctree\n"
            "child = subprocess.Popen(proctree.launch_argv([sys.executable, '-c', "
            "'import time; time.sleep(120)']), start_new_session=True)\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(120)\n",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    child = int(parent.stdout.readline())
    wait_for(lambda: "time.sleep(120)" in _cmdline(child), timeout=10, what="the exec")
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    wait_for(lambda: gone(child), timeout=10, what="the child to be told and end")


def test_a_launched_engine_runs_below_the_workers_cpu_priority_and_so_do_its_children():
    """DMX_ENGINE_NICE: vLLM and the processes it starts (its engine core) run that much below
    the worker, so that on a CPU node they cannot starve its heartbeats."""
    script = (
        "import os, subprocess, sys; "
        "child = subprocess.run([sys.executable, '-c', 'import os; print(os.nice(0))'], "
        "capture_output=True, text=True); "
        "print(os.nice(0), child.stdout.strip())"
    )
    launched = subprocess.run(
        proctree.launch_argv([PYTHON, "-c", script], nice=7),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert launched.returncode == 0, launched.stderr
    mine = os.nice(0)
    assert launched.stdout.split() == [str(mine + 7), str(mine + 7)]


def test_an_engine_in_a_session_of_its_own_runs_its_whole_autogroup_below_the_workers():
    """The worker starts vLLM in a session of its own, which the kernel schedules as an
    autogroup of its own: the group's nice is what counts against other sessions' processes.
    A launched process that shares its parent's session leaves the session's group alone.
    (A session in the kernel's root group, as one started under a container's init, reads an
    empty /proc/self/autogroup: the comparison is of the whole text.)"""
    show = [PYTHON, "-c", "print(open('/proc/self/autogroup').read().strip())"]
    alone = subprocess.run(
        proctree.launch_argv(show, nice=7),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
    )
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.strip().endswith(" nice 7"), alone.stdout
    mine = Path("/proc/self/autogroup").read_text()
    shared = subprocess.run(
        proctree.launch_argv(show, nice=7), cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert shared.returncode == 0, shared.stderr
    assert shared.stdout.strip() == mine.strip()
    assert Path("/proc/self/autogroup").read_text() == mine


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


ORPHANS = """
import json, os, subprocess, sys, time
from inference import proctree
proctree.become_subreaper()
# A leader that starts a grandchild in its group and dies, as vLLM's API server killed with -9
# leaves its engine core.
leader = subprocess.Popen(
    [sys.executable, "-c",
     "import subprocess, sys, time; "
     "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
     "print(g.pid, flush=True); time.sleep(120)"],
    start_new_session=True, stdout=subprocess.PIPE, text=True,
    env={**os.environ, "DMX_ENGINE_RUN_DIR": "/tmp/run-a"},
)
grandchild = int(leader.stdout.readline())
os.kill(leader.pid, 9)
time.sleep(0.5)
orphaned = proctree.group_members(leader.pid)
adopted = open(f"/proc/{grandchild}/stat").read().rsplit(")", 1)[1].split()[1] == str(os.getpid())
marked = proctree.has_environment(grandchild, "DMX_ENGINE_RUN_DIR=/tmp/run-a")
other = proctree.has_environment(grandchild, "DMX_ENGINE_RUN_DIR=/tmp/run-b")
found = proctree.stop_group(leader.pid, grace=5, keep=leader.pid)
leader.wait()
print(json.dumps({
    "orphaned": orphaned == [grandchild], "adopted": adopted, "marked": marked, "other": other,
    "found": found, "left": proctree.group_members(leader.pid), "grandchild": grandchild,
    "leader_status": leader.returncode,
}))
"""


def test_a_dead_leaders_orphans_are_adopted_stopped_and_reaped():
    result = run(ORPHANS)
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert facts["orphaned"] and facts["adopted"], facts
    assert facts["marked"] and not facts["other"], facts  # told apart by their environment
    assert facts["found"] and facts["left"] == [], facts
    assert gone(facts["grandchild"])
    # The leader's own status was left to Popen, not taken by the reaper: killed, not 0.
    assert facts["leader_status"] == -signal.SIGKILL


def test_stopping_an_empty_group_finds_nothing():
    started = time.monotonic()
    assert proctree.stop_group(2**22 + 12345, grace=5) is False
    assert time.monotonic() - started < 1
