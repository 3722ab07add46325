"""Is merging LoRA adapters for sampling faster? (prints JSON)

    python bench/lora_generation.py [--batch 32] [--tokens 96] [--repeats 3]

On the embedded SmolLM2-135M (fp32, torch threads = physical cores), sample one GRPO generation batch
(G=8 completions for each of batch/8 GSM8K prompts, fixed length, no early stop) with the project's
sampler, three ways:

* full      - the plain model (what full fine-tuning samples with), for reference;
* unmerged  - a peft LoRA model (r=16 on every projection, the config default) sampled as it is;
* merged    - the same LoRA model inside `lora_merged` (merge, sample, unmerge): the merge and unmerge
              time is counted in its seconds.

Each is the best of --repeats runs after one warm-up. What the engine does with LoRA follows this:
`model.lora_merge_for_generation` (default true).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRPO_APP_GSM8K_DIR", str(ROOT.parent / "shared" / "data" / "gsm8k"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()

    import torch

    from grpo_app.core.config import DataConfig, ModelConfig
    from grpo_app.core.data import load_gsm8k
    from grpo_app.core.models import apply_lora, load_model, set_threads
    from grpo_app.core.prompts import prompt_ids
    from grpo_app.training.sampler import SamplingParams, generate_completions, use_fast_attention
    from grpo_app.training.trainer import lora_merged

    threads = set_threads(0)
    model, tok, _ = load_model("embedded")
    use_fast_attention(model)
    probs, _ = load_gsm8k("train", DataConfig())
    group = 8
    ids = [prompt_ids(tok, p.question, DataConfig().system_prompt) for p in probs[: a.batch // group]]
    prompts = [x for x in ids for _ in range(group)]
    params = SamplingParams(max_new_tokens=a.tokens, temperature=1.0, stop_at_answer=False, seed=0)

    def timed(m, merge: bool) -> float:
        best = float("inf")
        for r in range(a.repeats + 1):
            t0 = time.perf_counter()
            with lora_merged(m, merge):
                out = generate_completions(m, tok, prompts, params, eos_token_ids=[-1])
            dt = time.perf_counter() - t0
            if r:  # the first is a warm-up
                best = min(best, dt)
        assert out.generated_tokens == len(prompts) * a.tokens
        return best

    res = {"threads": threads, "batch": len(prompts), "tokens_per_completion": a.tokens, "setups": {}}
    total = len(prompts) * a.tokens
    full_s = timed(model, False)
    res["setups"]["full"] = {"seconds": round(full_s, 2), "tokens_per_s": round(total / full_s, 1)}
    lora = apply_lora(model, ModelConfig(lora=True)).eval()
    t0 = time.perf_counter()
    with lora_merged(lora):
        pass
    merge_cycle = time.perf_counter() - t0
    for name, merge in (("unmerged", False), ("merged", True)):
        s = timed(lora, merge)
        res["setups"][name] = {"seconds": round(s, 2), "tokens_per_s": round(total / s, 1)}
    res["merge_plus_unmerge_seconds"] = round(merge_cycle, 3)
    res["merged_speedup"] = round(res["setups"]["unmerged"]["seconds"] / res["setups"]["merged"]["seconds"], 2)
    res["torch"] = torch.__version__
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
