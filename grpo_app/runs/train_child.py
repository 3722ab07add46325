"""The training child process of the web app: `python -m grpo_app.runs.train_child RUN_FOLDER --report-fd N [--resume]`.

Started by `RunManager(process=True)` (manager.py says why). It trains the run folder's config with the
same `run_job` and reporter as a training thread would; what it reports goes to the run folder and, one
JSON line per record, to the descriptor N (`PipeStore`). It reads its stdin: a line `stop` asks for a
stop; the end of stdin means the server is gone, which is a stop too. Ctrl-C in the server's terminal
reaches this process as well; it is ignored here, because the server turns it into a stop.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

import psutil

from grpo_app.core.run_folder import RunDir
from grpo_app.core.system import quiet_libraries
from grpo_app.runs.manager import PipeStore, _JobReporter, run_job


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m grpo_app.runs.train_child")
    ap.add_argument("run")
    ap.add_argument("--report-fd", type=int, required=True)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    quiet_libraries()
    run = RunDir(args.run)
    store = PipeStore(os.fdopen(args.report_fd, "w", encoding="utf-8"))
    reporter = _JobReporter(run, store, threading.Event())

    def listen():
        for line in sys.stdin:
            if line.strip() == "stop":
                reporter.request_stop()
        reporter.request_stop(why="the server that started this run is gone")

    reporter.status(pid=os.getpid(), pid_started=psutil.Process().create_time())  # "running" is this process
    threading.Thread(target=listen, name="stop-listener", daemon=True).start()
    run_job(run, args.resume, reporter)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the run folder is written: skip the interpreter's slow teardown, so the server is free sooner


if __name__ == "__main__":
    main()
