"""GGUF export of the real embedded SmolLM2-135M, read back by transformers: logits on a math prompt.

Tolerances relative to σ, the standard deviation of the float32 model's logits (σ ≈ 8.0 here). Measured once
on this machine: f16 max |Δ| 0.033 (0.004σ), mean 0.0044; q8_0 max 2.06 (0.26σ), mean 0.22 (0.027σ); the
argmax agreed at every position for both. Bounds: f16 max <= 0.02σ, mean <= 0.005σ; q8_0 max <= 0.5σ,
mean <= 0.06σ, argmax the same at >= 95% of positions.
"""

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("quant", ["f16", "q8_0"])
def test_embedded_model_gguf_logits(tmp_path, quant):
    from transformers import AutoModelForCausalLM

    from grpo_app.core.models import load_model
    from grpo_app.core.prompts import prompt_ids
    from grpo_app.export.model_files import write_gguf

    model, tok, _ = load_model("embedded", dtype="float32", device="cpu")
    ids = torch.tensor([prompt_ids(tok, "Tom has 12 apples and buys 30 more. How many apples does he have?",
                                   "Solve the math problem.")])
    with torch.no_grad():
        ref = model(ids).logits[0]
    assert write_gguf(model, tok, tmp_path / "m.gguf", quant, name="smollm2") == []
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="m.gguf", dtype=torch.float32).eval()
    with torch.no_grad():
        got = back(ids).logits[0]
    d, sigma = (got - ref).abs(), ref.std().item()
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    if quant == "f16":
        assert d.max().item() <= 0.02 * sigma and d.mean().item() <= 0.005 * sigma
    else:
        assert d.max().item() <= 0.5 * sigma and d.mean().item() <= 0.06 * sigma
    assert agree >= 0.95
