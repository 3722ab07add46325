"""Training in two processes (torchrun, gloo on CPU): one run folder, one Fisher, identical replicas."""

import json
import os
import subprocess
import sys

import pytest

from grpo_app.core.models import physical_cores

from .conftest import ROOT


def torchrun(*args, env):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "tests/dist_cli.py", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)


def succeeded(r) -> None:
    """Fail with both processes' whole output (an assert's message would be cut short: a worker that dies
    of a signal says why only in its stderr)."""
    if r.returncode != 0:
        pytest.fail(f"torchrun exited {r.returncode}\n--- stdout ---\n{r.stdout[-4000:]}\n--- stderr ---\n"
                    f"{r.stderr[-12000:]}", pytrace=False)


def left_the_group(r) -> None:
    """Both processes left the process group before exiting (tests/dist_cli.py reports it at exit)."""
    for rank in (0, 1):
        assert f"rank {rank} exits in a process group: False" in r.stderr, r.stderr[-3000:]


def events(run_dir):
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture
def env(tmp_path):
    e = dict(os.environ, GRPO_APP_RUNS_DIR=str(tmp_path), OMP_NUM_THREADS="1")
    e.pop("WORLD_SIZE", None)
    return e


def test_two_processes_train_one_run_with_one_fisher_and_identical_replicas(tmp_path, env):
    r = torchrun("train", "-c", "tests/configs/tiny.yaml", "-s", f"run.output_dir={tmp_path}",
                 "-s", "rewards.weights={correctness: 1.0, text_length: 1.0}", env=env)
    succeeded(r)
    left_the_group(r)
    assert "(2 processes)" in r.stdout
    runs = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(runs) == 1  # rank 0 made the folder, rank 1 trained into it
    run = runs[0]
    ev = events(run)
    kinds = [e["event"] for e in ev]
    assert kinds.count("stage_start") == 2 and "final_saved" in kinds and kinds[-1] == "finished"
    check = next(e for e in ev if e["event"] == "replicas_checked")
    assert check["processes"] == 2 and check["max_difference"] == 0.0 and check["tensors"] > 0
    fisher = next(e for e in ev if e["event"] == "fisher_done")
    assert fisher["samples"] == 2 * 4  # each process's 4 samples, averaged into one estimate
    assert (run / "ewc" / "stage-0" / "ewc.safetensors").is_file()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]  # one record per step, written once
    assert all(m["grad_norm"] > 0 for m in metrics)  # the replicas really moved (and stayed equal, above)
    assert all(m["ewc_penalty"] > 0 for m in metrics[3:])
    ck = sorted((run / "checkpoints" / "stage-1").glob("checkpoint-*"))[-1]
    assert (ck / "COMPLETE").is_file()
    assert (ck / "rng_state_0.pth").is_file() and (ck / "rng_state_1.pth").is_file()  # both processes' state
    assert not (run / "checkpoints" / "stage-1" / ".staging").exists()
    assert (run / "final" / "config.json").is_file()
    loaded = next(e for e in ev if e["event"] == "model_loaded")
    assert loaded["threads"] == max(1, physical_cores() // 2)  # the cores are split between the 2 processes


def test_two_processes_fail_together_when_there_is_no_run(tmp_path, env):
    r = torchrun("resume", "no-such-run", "--runs-dir", str(tmp_path), env=env)
    assert r.returncode != 0
    assert "Cannot resume" in r.stderr
    left_the_group(r)  # the failure path leaves it too
    assert not any(tmp_path.iterdir())


def _helpers_worker(rank, init_file, out_dir):
    import torch
    import torch.distributed as dist

    from grpo_app.core import distributed

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        res = {"active": distributed.active(), "main": distributed.is_main()}
        fisher = {"w": torch.full((3,), float(rank + 1)), "b": torch.tensor([2.0 * rank])}
        distributed.average_(fisher)
        res["fisher"] = {k: v.tolist() for k, v in fisher.items()}
        res["broadcast"] = distributed.broadcast(f"path-from-{rank}")
        res["any_true"] = distributed.any_true(rank == 1)
        res["none_true"] = distributed.any_true(False)
        same = torch.nn.Linear(3, 2)
        torch.nn.init.constant_(same.weight, 0.5)
        torch.nn.init.constant_(same.bias, 0.1)
        res["same"] = distributed.check_replicas(same)
        with torch.no_grad():
            same.bias[0] += 1e-6 * rank  # one replica drifts by a hair
        try:
            distributed.check_replicas(same)
            res["drift"] = "not detected"
        except RuntimeError as e:
            res["drift"] = str(e)
    finally:
        distributed.shutdown()
    res["left"] = not dist.is_initialized()
    distributed.shutdown()  # a second call, without a group, does nothing
    (out_dir / f"{rank}.json").write_text(json.dumps(res))


def test_process_group_helpers_average_broadcast_and_catch_drifting_replicas(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_helpers_worker, args=(str(tmp_path / "init"), tmp_path), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"{i}.json").read_text()) for i in (0, 1))
    assert r0["active"] and r1["active"] and r0["main"] and not r1["main"]
    for r in (r0, r1):
        assert r["fisher"] == {"w": [1.5, 1.5, 1.5], "b": [1.0]}  # the mean of both processes' estimates
        assert r["broadcast"] == "path-from-0"
        assert r["any_true"] is True and r["none_true"] is False
        assert r["same"] == {"processes": 2, "tensors": 2, "max_difference": 0.0}
        assert "different weights" in r["drift"]
        assert r["left"] is True


def test_a_stopped_run_resumes_in_two_processes(tmp_path, env, varied_reward):
    import time

    from grpo_app.core.config import load_config
    from grpo_app.runs.manager import RunManager

    cfg = load_config("tests/configs/tiny.yaml", [f"run.output_dir={tmp_path}", "stages[0].steps=3",
                                                  "rewards.weights={correctness: 1.0, text_length: 1.0}"])
    mgr = RunManager(tmp_path)
    run = mgr.start(cfg)
    t = time.time()
    while not mgr.snapshot()["metrics"] and time.time() - t < 120:
        time.sleep(0.1)
    assert mgr.stop() and mgr.wait(300)
    stopped_at = run.latest_checkpoint()["global_step"]
    assert run.read_status()["status"] == "stopped" and stopped_at < 5
    r = torchrun("resume", run.id, "--runs-dir", str(tmp_path), env=env)
    succeeded(r)
    left_the_group(r)
    assert run.read_status()["status"] == "completed"
    assert [m["step"] for m in run.metrics()] == [1, 2, 3, 4, 5]  # no gap, no duplicate
    ev = run.events()
    assert next(e for e in ev if e["event"] == "resumed")["step"] == stopped_at
    assert next(e for e in ev if e["event"] == "replicas_checked")["processes"] == 2


def test_ctrl_c_stops_both_processes_at_one_step_with_a_checkpoint(tmp_path, env):
    """Ctrl-C in a terminal sends SIGINT to torchrun and both processes (torchrun then forwards another
    and allows 30 s): rank 0 stops both at the next step boundary; the checkpoint holds both RNG states."""
    import signal
    import time

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "tests/dist_cli.py",
           "train", "-c", "tests/configs/tiny.yaml", "-s", f"run.output_dir={tmp_path}", "-s", "stages[0].steps=200",
           "-s", "rewards.weights={correctness: 1.0, text_length: 1.0}", "-s", "run.save_every=0"]
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        t = time.time()
        metrics = []
        while len(metrics) < 3 and time.time() - t < 300:
            metrics = list(tmp_path.glob("*/metrics.jsonl"))
            metrics = metrics and metrics[0].read_text().splitlines()
            time.sleep(0.2)
        assert len(metrics) >= 3, p.stdout.read() if p.poll() is not None else "no metrics"
        os.killpg(p.pid, signal.SIGINT)
        p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    run = next(d for d in tmp_path.iterdir() if d.is_dir())
    assert json.loads((run / "status.json").read_text())["status"] == "stopped"
    stopped = next(e for e in events(run) if e["event"] == "stopped")
    ck = run / "checkpoints" / "stage-0" / stopped["checkpoint"]
    assert stopped["step"] < 200 and (ck / "COMPLETE").is_file()
    assert (ck / "rng_state_0.pth").is_file() and (ck / "rng_state_1.pth").is_file()
