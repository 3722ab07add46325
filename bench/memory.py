"""Where a training run's memory goes: peak RSS per phase of each stage (prints JSON).

    GRPO_APP_GSM8K_DIR=../shared/data/gsm8k python bench/memory.py [--config quick] [--out FILE]

Each variant runs the preset in its own process (the real engine, embedded model, full fine-tuning with
the embedding frozen) while a thread reads the process's RSS every 20 ms and files it under the phase
running at that moment (and at each phase's start and end): sampling ("generate"), the forward+backward of the micro-batches
("forward_backward"), the optimizer step with the EWC gradient ("optimizer"), the Fisher pass ("fisher").
`peak_rss_mb` is the kernel's high-water mark (getrusage) for the whole run, model loading included.

Variants: the preset as it is (layer recompute on, the default); with `grpo.gradient_checkpointing=false`
(every layer's activations kept for backward); with `grpo.lean_activations=false` (HF's own MLP/RMSNorm
backward); with `ewc.offload=false` (Fisher and anchor held in memory rather than read from the run
folder); with `grpo.micro_batch_size=4` (half the completions per forward+backward); with `model.trainable_layers=15`
(only the top half of the layers trained), with and without layer recompute.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRPO_APP_GSM8K_DIR", str(ROOT.parent / "shared" / "data" / "gsm8k"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from common import emit, run_child  # noqa: E402  (bench/, the script's own folder)

VARIANTS = {
    "preset": [],
    "no_checkpointing": ["grpo.gradient_checkpointing=false"],
    "hf_modules": ["grpo.lean_activations=false"],
    "ewc_in_memory": ["ewc.offload=false"],
    "micro4": ["grpo.micro_batch_size=4"],
    "top15": ["model.trainable_layers=15"],
    "top15_no_checkpointing": ["model.trainable_layers=15", "grpo.gradient_checkpointing=false"],
}


def run_one(config: str, overrides: list[str]) -> dict:
    import psutil

    from grpo_app.core.config import load_config
    from grpo_app.core.run_folder import RunDir
    from grpo_app.training import engine
    from grpo_app.training import trainer as T
    from grpo_app.training.optim import AdamWBF16Moments

    proc = psutil.Process()
    state = {"stage": 0, "phase": "load"}
    peaks: dict[str, float] = {}
    stop = threading.Event()

    def note():
        key = f"stage{state['stage']}/{state['phase']}"
        peaks[key] = max(peaks.get(key, 0.0), proc.memory_info().rss / 2**20)

    def sampler():
        while not stop.is_set():
            note()
            time.sleep(0.02)

    patched = []

    def phase(cls, name, label):
        orig = getattr(cls, name)
        patched.append((cls, name, orig))

        def wrapped(*a, **k):
            prev, state["phase"] = state["phase"], label
            note()  # phases shorter than the sampling interval are still seen, at their ends
            try:
                return orig(*a, **k)
            finally:
                note()
                state["phase"] = prev

        setattr(cls, name, wrapped)

    phase(T.CurriculumGRPOTrainer, "_generate_single_turn", "generate")
    phase(T.CurriculumGRPOTrainer, "training_step", "forward_backward")
    phase(AdamWBF16Moments, "step", "optimizer")
    phase(T.CurriculumGRPOTrainer, "_ewc_grad_hook", "optimizer")  # (inside a step: the trainer's own methods)

    class Phases(engine.Observer):  # the Fisher pass through the engine's supported hook
        def fisher_begin(self, stage):
            state["phase"] = "fisher"

        def fisher_end(self, stage):
            state["stage"] += 1
            state["phase"] = "other"

    cfg = load_config(config, [*overrides, "run.save_every=0", "run.eval_n=0"])
    threading.Thread(target=sampler, daemon=True).start()
    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run = RunDir.create(Path(tmp), cfg)
            state["phase"] = "other"
            engine.train(cfg, run, observers=[Phases()])
    finally:
        stop.set()
        for obj, name, orig in reversed(patched):
            setattr(obj, name, orig)
    return {
        "overrides": overrides,
        "seconds": round(time.perf_counter() - t0, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "phases_peak_rss_mb": {k: round(v) for k, v in sorted(peaks.items())},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="quick")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(run_one(a.config, VARIANTS[a.child])))
        return
    res = {"config": a.config, "model": "SmolLM2-135M-Instruct (embedded), fp32, embedding frozen", "variants": {}}
    for name in a.variants.split(","):
        res["variants"][name] = run_child(__file__, ["--config", a.config, "--child", name], name)
        print(f"# {name}: {json.dumps(res['variants'][name])}", file=sys.stderr, flush=True)
    emit(res, a.out)


if __name__ == "__main__":
    main()
