"""kill -9 of a real training process, then a fresh RunManager (what a restarted app builds) lists the
run as interrupted with its metrics, and Resume continues from the last complete checkpoint with the
stage, step and Fisher/anchor state it had."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from grpo_app.core.run_folder import RunDir
from grpo_app.runs.manager import RunManager

ROOT = Path(__file__).resolve().parent.parent
# The CLI, with the tests' text_length reward registered (a random model's texts differ in length, so
# groups get advantages and the weights really move away from the stage-1 anchor).
TRAIN = (
    "import sys; from grpo_app.core.rewards import REWARD_FUNCS; from tests.conftest import text_length; "
    "REWARD_FUNCS['text_length'] = text_length; from grpo_app.cli import main; sys.exit(main(sys.argv[1:]))"
)


def _complete_checkpoints(root: Path) -> list[dict]:
    out = []
    for done in root.glob("*/checkpoints/stage-*/checkpoint-*/COMPLETE"):
        state = json.loads((done.parent / "engine_state.json").read_text())
        out.append(state)
    return out


def test_sigkill_during_stage_two_then_resume(tmp_path, varied_reward):
    root = tmp_path / "runs"
    cmd = [
        sys.executable, "-c", TRAIN, "train", "-c", "tests/configs/tiny.yaml",
        "-s", f"run.output_dir={root}", "-s", "stages[0].steps=4", "-s", "stages[1].steps=8",
        "-s", "run.save_every=2", "-s", "run.keep_checkpoints=3",
        "-s", "rewards.weights={correctness: 1.0, text_length: 1.0}",
    ]  # fmt: skip
    env = {**os.environ, "GRPO_APP_RUNS_DIR": str(root)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 600
        while time.time() < deadline and proc.poll() is None:
            if any(c["stage_index"] == 1 for c in _complete_checkpoints(root)):
                break  # a checkpoint inside stage 2: the Fisher of stage 1 is part of the state
            time.sleep(0.05)
        assert proc.poll() is None, f"training ended before the kill: {proc.stderr.read()[-2000:]}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()

    # What a restarted app sees.
    manager = RunManager(root)
    (run,) = manager.runs()
    assert run.effective_status() == "interrupted"
    last = run.latest_checkpoint()
    assert last is not None and last["stage_index"] == 1
    logged = [m["step"] for m in run.metrics()]
    assert logged == list(range(1, len(logged) + 1)) and len(logged) >= last["global_step"]

    run = manager.resume(run.id)
    assert manager.wait(600)
    status = run.read_status()
    assert status["status"] == "completed", status.get("error")
    resumed = [e for e in run.events() if e["event"] == "resumed"]
    assert resumed[0]["stage"] == 1 and resumed[0]["step"] == last["global_step"]
    assert resumed[0]["stage_step"] == last["stage_step"]
    metrics = run.metrics()
    assert [m["step"] for m in metrics] == list(range(1, 13))  # steps after the checkpoint redone once
    after = [m for m in metrics if m["step"] > last["global_step"]]
    assert after and all(m["stage"] == 1 for m in after)
    assert all(m["ewc_penalty"] > 0 for m in after[1:])  # the stage-1 Fisher and anchor came back
    assert RunDir(run.path).final_dir.is_dir()
