"""The training pass with and without length buckets, on a real run's completions.

TRL pads every completion of a generation batch to the longest one; the engine's training pass can run a
micro-batch's completions in buckets of similar length instead, each cut to its longest row
(`EngineOptions.bucket_lengths`, trainer departure 3). How much that saves depends on how the lengths
spread, so this bench replays the groups a real run sampled (its `steps.jsonl`: questions, completions,
advantages) through the engine's own loss and backward on the embedded model, exactly as its training pass
would see them: the zero-advantage rows skipped, every completion padded to its step's longest, one
micro-batch per `micro_batch_size` rows in order (a setting may change it: with buckets, larger micro-batches
have fewer forwards and less padding). No optimizer step, so every setting sees the same weights.
The settings take turns on every step (a slow minute of the host hits them all alike); the JSON gives
each one's total seconds and positions run, and the ratio to the first setting. A setting ending in
'/whole' has the layer recompute redo each MLP's down projection, as before 2026-11-26 (`lean._GateUpFunction`);
one ending in '/keep' recomputes nothing: every layer keeps its activations for backward
(`grpo.gradient_checkpointing: false`). One ending in '/trl0' replays the advantages as the run recorded them;
without it, a group whose answers all earned the same total gets advantages of exactly 0, as the trainer gives
them since 2026-12-02 (departure 4; the runs before recorded TRL's float32 residue, about +-1e-3, and trained
those rows). One with '/reproject' has the LM head project every tile of logits again in backward, as TRL's
does; without it, the pass keeps them from the forward, as the trainer does since 2026-12-02 (departure 3,
`training/lm_head.py`; the same numbers bit for bit).

    python bench/bucket_lengths.py --run models/runs/RUN --settings off,0,16,32,64,64@32 --out assets/bucket_lengths.json
    python bench/bucket_lengths.py --run models/runs/RUN --settings 64,64/whole --out assets/recompute_split.json
    python bench/bucket_lengths.py --run models/runs/RUN --config progressive --settings 64,64/keep --every 2
    python bench/bucket_lengths.py --run models/runs/RUN --config progressive --settings 64/keep/trl0,64/keep
    python bench/bucket_lengths.py --run models/runs/RUN --config progressive --settings 64/keep/reproject,64/keep
    python bench/bucket_lengths.py --run models/runs/RUN --config progressive --settings 64/keep --every 4 --keep-freed-memory off

`--keep-freed-memory on|off` replays inside `optim.held_heap` or not (`grpo.keep_freed_memory`; default: the
preset's). It holds for the whole process, so compare it across processes, one reading each, in turns; the JSON
gives the process's page faults and kernel seconds beside the times.
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402

from bench.common import emit  # noqa: E402
from grpo_app.core.config import load_config  # noqa: E402
from grpo_app.core.prompts import prompt_ids  # noqa: E402
from grpo_app.core.rewards import build_rewards  # noqa: E402
from grpo_app.training import lm_head  # noqa: E402
from grpo_app.training.engine import prepare_model  # noqa: E402
from grpo_app.training.estimate import KEPT_LOGITS_BYTES  # noqa: E402
from grpo_app.training.lean import decoder_layers  # noqa: E402
from grpo_app.training.optim import held_heap  # noqa: E402
from grpo_app.training.settings import grpo_args  # noqa: E402
from grpo_app.training.trainer import CurriculumGRPOTrainer, EngineOptions, restore_forward  # noqa: E402


def step_rows(steps_file: Path, tok, system_prompt: str, every: int, recorded: bool = False) -> list[list[tuple]]:
    """Each replayed step's rows as the training pass gets them: (prompt ids, completion ids, advantage). A group
    whose totals are all equal gets advantages of 0 (departure 4), unless `recorded` (the run's own values)."""
    steps = []
    for line in steps_file.read_text().splitlines()[::every]:
        rows = []
        for g in json.loads(line)["groups"]:
            p = prompt_ids(tok, g["question"], system_prompt)
            flat = max(g["totals"]) - min(g["totals"]) <= 1e-9
            for text, adv in zip(g["completions"], g["advantages"]):
                adv = 0.0 if flat and not recorded else adv
                rows.append((p, tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id], adv))
        steps.append(rows)
    return steps


def micro_batches(rows: list[tuple], micro: int, pad: int) -> list[dict]:
    """One step's micro-batches of `micro` rows in order, zero-advantage rows out, every completion padded to the
    step's longest (as TRL pads the generation batch) and every prompt left-padded to the longest."""
    width = max(len(c) for _, c, _ in rows)
    plen = max(len(p) for p, _, _ in rows)
    num_items = torch.tensor(float(sum(len(c) for _, c, _ in rows)))
    out = []
    for start in range(0, len(rows), micro):
        part = [r for r in rows[start : start + micro] if r[2] != 0]
        if part:
            out.append({
                "prompt_ids": torch.tensor([[pad] * (plen - len(p)) + p for p, _, _ in part]),
                "prompt_mask": torch.tensor([[0] * (plen - len(p)) + [1] * len(p) for p, _, _ in part]),
                "completion_ids": torch.tensor([c + [pad] * (width - len(c)) for _, c, _ in part]),
                "completion_mask": torch.tensor([[1] * len(c) + [0] * (width - len(c)) for _, c, _ in part]),
                "advantages": torch.tensor([a for _, _, a in part], dtype=torch.float32),
                "num_items_in_batch": num_items,
            })
    return out


def parse_setting(text: str, default_micro: int) -> tuple[bool, int, int, bool, bool]:  # ('/trl0': see main)
    """'off' | 'OVERHEAD' | either with '@MICRO' and/or '/whole' or '/keep' -> (bucket_lengths, bucket_overhead,
    micro-batch size, split MLP, layer recompute). '/whole': the recompute redoes each MLP's down projection, as
    it did before 2026-11-26 (lean's whole-MLP function instead of the split one, `lean._GateUpFunction`).
    '/keep': no layer recompute at all (each layer keeps its activations, as with gradient_checkpointing off)."""
    text, keep, _ = text.partition("/keep")
    text, whole, _ = text.partition("/whole")
    head, _, micro = text.partition("@")
    micro = int(micro) if micro else default_micro
    return (head != "off", 0 if head == "off" else int(head), micro, not whole, not keep)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="a run folder with steps.jsonl")
    ap.add_argument("--config", default="classroom", help="preset whose model settings and prompt to use")
    ap.add_argument("--settings", default="off,0,16,32,64",
                    help="comma-separated: 'off' = one padded pass, a number = bucket_overhead; '@N' after either "
                         "sets the micro-batch size (default: the preset's)")
    ap.add_argument("--every", type=int, default=1, help="replay every k-th step of the run (1 = all)")
    ap.add_argument("--keep-freed-memory", choices=("config", "on", "off"), default="config",
                    help="replay inside optim.held_heap (on), or not (off); config: the preset's grpo.keep_freed_memory")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    cfg = load_config(a.config)
    keep = cfg.grpo.keep_freed_memory if a.keep_freed_memory == "config" else a.keep_freed_memory == "on"
    with held_heap(keep) as held:
        res = replay(a, cfg)
    res["keep_freed_memory"] = {"asked": keep, "held": held}
    emit(res, a.out)


def replay(a, cfg) -> dict:
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    run = Path(a.run)
    settings = a.settings.split(",")
    model, tok, _ = prepare_model(cfg)
    recorded_of = {s: "/trl0" in s for s in settings}
    budget_of = {s: 0 if "/reproject" in s else KEPT_LOGITS_BYTES for s in settings}
    steps_of = {r: step_rows(run / "steps.jsonl", tok, cfg.data.system_prompt, a.every, recorded=r)
                for r in set(recorded_of.values())}
    steps = next(iter(steps_of.values()))
    funcs, _ = build_rewards(cfg.rewards.weights)
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2"}] * 8)
    trainers, micro_of, split_of, recompute_of = {}, {}, {}, {}
    mlps = [m for m in model.modules() if hasattr(m, "_grpo_split_down")]
    layers = [m for m in decoder_layers(model) if hasattr(m, "_grpo_recompute")]
    with tempfile.TemporaryDirectory() as tmp:
        for s in settings:
            bucket, overhead, micro, split_of[s], recompute_of[s] = parse_setting(
                s.replace("/trl0", "").replace("/reproject", ""), cfg.micro_batch)
            scfg = copy.deepcopy(cfg)
            scfg.grpo.micro_batch_size = micro
            restore_forward(model)
            tr = CurriculumGRPOTrainer(model=model, processing_class=tok, reward_funcs=funcs,
                                       args=grpo_args(scfg, 0, Path(tmp) / s, "cpu"), train_dataset=ds,
                                       engine_options=EngineOptions(bucket_lengths=bucket, bucket_overhead=overhead))
            tr.model.train()
            tr.current_gradient_accumulation_steps = tr.args.gradient_accumulation_steps  # set by train() normally
            trainers[s], micro_of[s] = tr, micro
        seconds = dict.fromkeys(settings, 0.0)
        positions = dict.fromkeys(settings, 0)
        for i in range(len(steps)):
            for s in settings[i % len(settings):] + settings[: i % len(settings)]:  # take turns
                rows = steps_of[recorded_of[s]][i]
                seen: list[int] = []
                hook = model.model.embed_tokens.register_forward_hook(
                    lambda m, args, o, seen=seen: seen.append(args[0].numel()))
                recompute = recompute_of[s] and cfg.grpo.gradient_checkpointing
                for layer in layers:
                    layer._grpo_recompute = recompute
                for m in mlps:
                    m._grpo_split_down = split_of[s] and recompute
                mbs = micro_batches(rows, micro_of[s], tok.pad_token_id)
                t0 = time.perf_counter()
                for mb in mbs:
                    with lm_head.keep_logits(budget_of[s]):  # (as the trainer's training_step, per micro-batch)
                        trainers[s]._compute_loss(model, mb).backward()
                seconds[s] += time.perf_counter() - t0
                hook.remove()
                positions[s] += sum(seen)
                model.zero_grad(set_to_none=True)
    base = settings[0]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "run": str(run), "config": a.config, "every": a.every, "steps_replayed": len(steps),
        "threads": torch.get_num_threads(),
        "process_page_faults": usage.ru_minflt - usage0.ru_minflt,
        "process_kernel_s": round(usage.ru_stime - usage0.ru_stime, 2),
        "settings": {s: {"seconds": round(seconds[s], 2), "positions": positions[s],
                         "time_vs_" + base: round(seconds[s] / seconds[base], 3),
                         "positions_vs_" + base: round(positions[s] / positions[base], 3)} for s in settings},
    }


if __name__ == "__main__":
    main()
