"""The real app (`python app.py`) in a subprocess, for the API, robustness and browser tests.

It serves the tiny-random presets of tests/configs/app on a free port, with its runs, uploads and
evaluation cache in a temporary folder, offline. Deadlines are generous: the machine may be busy.
"""

from __future__ import annotations

import html
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APP_CONFIGS = ROOT / "tests" / "configs" / "app"
START_TIMEOUT = 240
HEADERS = ["name", "source", "min difficulty", "max difficulty", "steps"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stages(*rows) -> dict:
    """A stages-table value as the API takes it."""
    return {"headers": HEADERS, "data": [list(r) for r in rows]}


def start_args(**over) -> list:
    """Arguments of /start in order, defaults = the tiny-app preset."""
    args = {
        "preset": "tiny-app",
        "model": "tiny-random",
        "data_source": "auto",
        "upload": None,
        "stages": stages(["add", "arithmetic", 1, 1, 15], ["three-terms", "arithmetic", 2, 2, 15]),
        "num_generations": 4,
        "completion_length": 24,
        "prompts_per_step": 2,
        "learning_rate": "0.001",
        "ewc": True,
        "ewc_lambda": 1000,
        "lora": False,
        "seed": 42,
        "run_name": "",
        "loss_type": "dapo",
        "scale_rewards": "group",
        "custom_rewards": {"headers": ["name", "weight", "rule", "value", "must"], "data": [["", None, "", "", ""]]},
    }
    unknown = set(over) - set(args)
    assert not unknown, unknown
    args.update(over)
    return list(args.values())


class AppServer:
    def __init__(self, workdir: Path, extra_env: dict | None = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.runs_dir = self.workdir / "runs"
        self.log_path = self.workdir / "app.log"
        self.extra_env = extra_env or {}
        self.proc: subprocess.Popen | None = None

    def env(self) -> dict:
        from grpo_app.core.models import cache_root, embedded_model_dir

        embedded_model_dir()  # the tiny model borrows the embedded tokenizer: make sure it is cached
        env = dict(os.environ)
        (self.workdir / "tmp").mkdir(exist_ok=True)
        env.update(
            HF_HUB_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
            PYTHONUNBUFFERED="1",
            GRADIO_SERVER_PORT=str(self.port),
            GRADIO_SERVER_NAME="127.0.0.1",
            GRADIO_TEMP_DIR=str(self.workdir / "gradio"),
            TMPDIR=str(self.workdir / "tmp"),
            GRPO_APP_RUNS_DIR=str(self.runs_dir),
            GRPO_APP_MODELS_DIR=str(self.workdir / "models"),
            GRPO_APP_CACHE_DIR=str(cache_root()),
            GRPO_APP_CONFIGS_DIR=str(APP_CONFIGS),
            GRPO_APP_DEFAULT_PRESET="tiny-app",
            GRPO_APP_TIMER_S="1.0",
        )
        env.pop("SPACE_ID", None)
        env.update(self.extra_env)
        return env

    def start(self) -> AppServer:
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "app.py"],
            cwd=ROOT,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.time() + START_TIMEOUT
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the app exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/config", timeout=5) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.5)
        self.kill()
        raise RuntimeError(f"the app did not answer within {START_TIMEOUT} s:\n{self.log_tail()}")

    def client(self):
        from gradio_client import Client

        return Client(self.url, verbose=False, download_files=str(self.workdir / "downloads"))

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def interrupt(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def stop(self, timeout: float = 180) -> int | None:
        if self.proc is None:
            return None
        self.interrupt()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None


def wait_for(pred, timeout: float = 300, every: float = 0.5, what: str = "condition"):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def status(client) -> dict:
    return client.predict(api_name="/status")


def wait_idle(client, timeout: float = 300) -> dict:
    """Until no run trains on the server (stop one that does)."""
    st = status(client)
    if st["active"]:
        client.predict(api_name="/stop")
    return wait_for(lambda: (s := status(client)) and not s["active"] and s, timeout, what="the server to be idle")


def text_of(result) -> str:
    """Every string in an API result (tuples, dicts, updates), joined: what a person would read."""
    out = []

    def walk(x):
        if isinstance(x, str):
            out.append(html.unescape(x))
        elif isinstance(x, dict):
            for k, v in x.items():
                if k != "__type__":
                    walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(result)
    return "\n".join(out)


@pytest.fixture(scope="module")
def app_server(tmp_path_factory):
    """A real app subprocess for one test module (each test leaves it idle)."""
    server = AppServer(tmp_path_factory.mktemp("app")).start()
    yield server
    server.stop()
