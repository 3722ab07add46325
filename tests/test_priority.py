"""The server's threads yield the CPU to the training (grpo_app/priority.py). Nice values only ever go up, so
what raises them runs in a subprocess of its own, never in the test process."""

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from grpo_app.manager import RunManager
from grpo_app.priority import TASKS, Launcher, lower_threads, nice_from_env, thread_nice
from grpo_app.runs import RunDir

linux = pytest.mark.skipif(not TASKS.is_dir(), reason="per-thread nice values are read from Linux /proc")


def test_nice_from_env(monkeypatch):
    monkeypatch.delenv("GRPO_APP_SERVER_NICE", raising=False)
    assert nice_from_env() == 10
    for raw, want in (("0", 0), ("5", 5), ("40", 19), ("-3", 0), ("lots", 10)):
        monkeypatch.setenv("GRPO_APP_SERVER_NICE", raw)
        assert nice_from_env() == want
    assert lower_threads(0, set()) is None  # 0: nothing changes


def test_a_training_is_started_on_the_launcher_thread(tmp_path):
    from grpo_app.config import load_config

    manager = RunManager(tmp_path / "runs")
    manager.launcher = Launcher()
    seen = []
    manager._start_training = lambda run, resume: seen.append(threading.get_native_id())
    run = RunDir.create(tmp_path / "runs", load_config("quick"))
    manager._launch(run, resume=False)
    assert seen == [manager.launcher.native_id] != [threading.get_native_id()]


@linux
def test_server_threads_yield_and_trainings_keep_the_priority(tmp_path):
    script = textwrap.dedent(
        """
        import subprocess, sys, threading, time
        from grpo_app.priority import Launcher, lower_threads, thread_nice

        launcher = Launcher()                       # made first, at the process's priority
        stop = threading.Event()
        server = threading.Thread(target=stop.wait)  # stands for the web server's threads
        server.start()
        changed = lower_threads(10, keep={threading.get_native_id(), launcher.native_id})
        nice_of_child = "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"

        def from_server():  # a request's thread: what it starts inherits its nice value...
            go.wait()
            out["server"] = thread_nice()
            out["its_thread"] = []
            t = threading.Thread(target=lambda: out["its_thread"].append(thread_nice()))
            t.start(); t.join()
            out["its_process"] = int(subprocess.check_output([sys.executable, "-c", nice_of_child]))
            # ...unless it starts it through the launcher
            out["launched_process"] = launcher.run(
                lambda: int(subprocess.check_output([sys.executable, "-c", nice_of_child])))
            out["launched_thread"] = launcher.run(thread_nice)

        out, go = {}, threading.Event()
        worker = threading.Thread(target=from_server)
        worker.start()  # made by the main thread, so not yet niced: lower it as the app's threads are
        lower_threads(10, keep={threading.get_native_id(), launcher.native_id})
        go.set()
        worker.join()
        stop.set()
        print(changed, thread_nice(), out)
        """
    )
    root = str(Path(__file__).resolve().parent.parent)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={"PYTHONPATH": root})
    assert res.returncode == 0, res.stderr
    base = thread_nice()
    changed, main_nice, out = res.stdout.strip().split(" ", 2)
    out = eval(out)  # noqa: S307 - our own script's dict of ints
    assert int(changed) >= 1 and int(main_nice) == base  # the server thread changed, the main thread kept
    assert out["server"] == out["its_thread"][0] == out["its_process"] == max(10, base)
    assert out["launched_process"] == out["launched_thread"] == base
