"""Model export: GGUF written with the gguf package and read back by transformers (logits, tokenizer, chat
template), safetensors folders with a model card written from the run, the Hub push up to the network
call, and `python -m grpo_app export`.

Logit tolerances, relative to σ = the standard deviation of the reference logits (measured on this tiny
model: f16 max |Δ| 0.0013σ; q8_0 max 0.041σ, mean 0.0077σ, every argmax the same):
  f32   exact (the same float32 numbers);
  f16   max |Δ| <= 0.01σ;
  q8_0  max |Δ| <= 0.25σ, mean |Δ| <= 0.03σ, argmax the same at >= 95% of positions, and not exact.
"""

import json

import numpy as np
import pytest
import torch

from grpo_app.core.config import load_config
from grpo_app.core.fileio import atomic_write_json
from grpo_app.core.run_folder import RunDir
from grpo_app.evaluation.scoring import summarize
from grpo_app.evaluation.stats import paired, wilson_interval
from grpo_app.export import model_files as me

from .conftest import make_tiny

TEXTS = [
    "What is 12 + 30? Show your work briefly.\n#### 42",
    "  naïve café 🚀 <|im_start|>user\nhi<|im_end|>",
    "Tom has 3 apples; he buys 25 more. 3 + 25 = 28\n#### 28",
]


@pytest.fixture(scope="module")
def small_tok():
    """A byte-level BPE tokenizer with a few hundred tokens (transformers reads a 49k-token GGUF vocabulary
    in ~20 s; this keeps the logit tests fast), with SmolLM2's special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from grpo_app.core.models import load_tokenizer, resolve_model

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(TEXTS * 20, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>", unk_token="<|endoftext|>",
        pad_token="<|im_end|>",
    )
    tok.chat_template = load_tokenizer(resolve_model("tiny-random")).chat_template
    return tok


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits[0]


def _read_back(folder, name):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=name, dtype=torch.float32).eval()


@pytest.mark.parametrize("quant", ["f32", "f16", "q8_0"])
def test_gguf_reads_back_with_transformers_and_logits_match(small_tok, tmp_path, quant):
    model = make_tiny(small_tok)
    ids = small_tok(TEXTS[0], return_tensors="pt")["input_ids"]
    ref = _logits(model, ids)
    notes = me.write_gguf(model, small_tok, tmp_path / "m.gguf", quant, name="tiny")
    assert notes == ["llama.cpp does not know this tokenizer's pre-tokenizer; the file says 'default'."]
    got = _logits(_read_back(tmp_path, "m.gguf"), ids)
    d, sigma = (got - ref).abs(), ref.std().item()
    if quant == "f32":
        assert torch.equal(got, ref)
    elif quant == "f16":
        assert d.max().item() <= 0.01 * sigma
    else:
        assert 0 < d.max().item() <= 0.25 * sigma and d.mean().item() <= 0.03 * sigma
        assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.95


def test_qwen2_architecture_reads_back_exactly(small_tok, tmp_path):
    """Qwen2 (the qwen-0.5b preset's family): q/k/v biases, no q/k permutation."""
    model = make_tiny(small_tok, arch="qwen2")
    for layer in model.model.layers:  # random biases, so a lost or misplaced bias shows in the logits
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            torch.nn.init.normal_(proj.bias, std=0.5)
    ids = small_tok(TEXTS[2], return_tensors="pt")["input_ids"]
    me.write_gguf(model, small_tok, tmp_path / "q.gguf", "f32")
    back = _read_back(tmp_path, "q.gguf")
    assert back.config.model_type == "qwen2"
    assert torch.equal(_logits(back, ids), _logits(model, ids))


def test_tensor_types_follow_llama_cpp(small_tok, tmp_path):
    import gguf

    model = make_tiny(small_tok)
    me.write_gguf(model, small_tok, tmp_path / "q.gguf", "q8_0")
    r = gguf.GGUFReader(tmp_path / "q.gguf")
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert "output.weight" not in types  # tied LM head: readers tie it again
    assert types["token_embd.weight"] == "Q8_0" and types["blk.1.ffn_down.weight"] == "Q8_0"
    assert types["blk.0.attn_norm.weight"] == "F32" and types["output_norm.weight"] == "F32"
    assert len(types) == 1 + 2 * 9 + 1  # embedding, 9 per block, final norm
    # q_proj is stored permuted the way llama.cpp permutes it (undone by the reader, checked by the logits test)
    q = model.model.layers[0].self_attn.q_proj.weight.detach().numpy()
    stored = next(t for t in r.tensors if t.name == "blk.0.attn_q.weight")
    back = gguf.dequantize(stored.data, stored.tensor_type).reshape(q.shape)
    assert not np.allclose(back, q, atol=0.05) and np.allclose(back, me._permute_qk(q, 4), atol=0.05)


def test_the_tokenizer_reads_back_the_same(small_tok, tmp_path):
    from transformers import AutoTokenizer

    me.write_gguf(make_tiny(small_tok), small_tok, tmp_path / "m.gguf", "f16")
    back = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="m.gguf")
    for text in TEXTS + ["What is 7 * 6?"]:
        assert back(text)["input_ids"] == small_tok(text)["input_ids"], text
    msgs = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "What is 2 + 2?"}]
    assert back.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == small_tok.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True
    )
    assert (back.bos_token, back.eos_token, back.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")


@pytest.mark.slow  # reading a 49k-token vocabulary back takes minutes on a busy 2-core machine
def test_gguf_of_the_embedded_tokenizer_mirrors_the_embedded_file(tokenizer, tmp_path):
    """The tokenizer, chat template and metadata keys of the app's own GGUF, as llama.cpp wrote them."""
    import gguf
    from transformers import AutoTokenizer

    from grpo_app.core.models import embedded_gguf_path

    assert me.tokenizer_pre(tokenizer) == "smollm"  # llama.cpp's hash of SmolLM's pre-tokenizer
    me.write_gguf(make_tiny(tokenizer), tokenizer, tmp_path / "t.gguf", "f16", name="tiny")
    back = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="t.gguf")
    for text in TEXTS:
        assert back(text)["input_ids"] == tokenizer(text)["input_ids"], text
        assert back.decode(back(text)["input_ids"]) == text
    msgs = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "What is 2 + 2?"}]
    assert back.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == tokenizer.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True
    )
    assert (back.eos_token, back.pad_token) == ("<|im_end|>", "<|im_end|>")

    ours = gguf.GGUFReader(tmp_path / "t.gguf").fields
    ref = gguf.GGUFReader(embedded_gguf_path()).fields
    descriptive = {"general.organization", "general.basename", "general.size_label", "general.license", "general.languages"}
    assert set(ref) - descriptive <= set(ours), set(ref) - descriptive - set(ours)
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.chat_template"):
        assert ours[key].contents() == ref[key].contents(), key
    for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id",
                "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.add_bos_token", "llama.vocab_size"):
        assert ours[key].contents() == ref[key].contents(), key
    assert ours["tokenizer.ggml.tokens"].contents() == ref["tokenizer.ggml.tokens"].contents()
    assert ours["tokenizer.ggml.merges"].contents() == ref["tokenizer.ggml.merges"].contents()
    assert ours["tokenizer.ggml.token_type"].contents() == ref["tokenizer.ggml.token_type"].contents()


# ------------------------------------------------------------------------------------------------
# Exporting a run
# ------------------------------------------------------------------------------------------------
def _records(correct: list[int]) -> list[dict]:
    return [{"id": i, "correct": bool(c), "strict_correct": bool(c), "has_format": True, "difficulty": 2,
             "tokens": 10} for i, c in enumerate(correct)]


def finished_run(root, tokenizer, with_eval=True) -> RunDir:
    """A completed run folder with a tiny model in final/ and (test data) one saved comparison."""
    cfg = load_config("tests/configs/tiny.yaml", [f"run.output_dir={root}", "run.name=exp"])
    run = RunDir.create(root, cfg)
    model = make_tiny(tokenizer, seed=3)
    model.save_pretrained(run.final_dir)
    tokenizer.save_pretrained(run.final_dir)
    run.write_status(status="completed", started=1000.0, ended=1600.0)
    if with_eval:
        base, trained = _records([1] * 3 + [0] * 17), _records([1] * 9 + [0] * 11)
        atomic_write_json(run.eval_dir / "gsm8k-n20-seed0-d1-8.json", {
            "origin": "GSM8K test",
            "base": {"summary": summarize(base), "records": base},
            "trained": {"summary": summarize(trained), "records": trained},
            "paired": paired(base, trained),
        })
    return run


def test_model_card_holds_base_curriculum_settings_and_compare_intervals(tmp_path, tokenizer):
    run = finished_run(tmp_path / "runs", tokenizer)
    card = me.model_card(run, "gguf", "q8_0", [f"{run.id}-q8_0.gguf"])
    lo, hi = wilson_interval(9, 20)
    blo, bhi = wilson_interval(3, 20)
    assert f"45.0% [{100 * lo:.1f}%, {100 * hi:.1f}%]" in card  # trained 9/20
    assert f"15.0% [{100 * blo:.1f}%, {100 * bhi:.1f}%]" in card  # base 3/20
    assert "| gsm8k-n20-seed0-d1-8 | GSM8K test | 20 |" in card
    assert "tiny randomly initialised Llama" in card and "base_model:" not in card  # no hub id to claim
    assert "| 1 | s1 | arithmetic | 1–1 | 2 | 16 |" in card and "| 2 | s2 | arithmetic | 2–2 | 2 | 16 |" in card
    assert "G (completions per prompt) 4" in card and "EWC: on, λ 1000" in card
    assert "tags:\n- grpo" in card and "- gguf" in card and f"{run.id}-q8_0.gguf" in card
    assert "**Training time:** 10.0 min" in card
    empty = finished_run(tmp_path / "runs2", tokenizer, with_eval=False)
    assert "no saved comparison" in me.model_card(empty)


def test_embedded_base_is_named_with_its_hub_id(tmp_path):
    cfg = load_config("quick", [f"run.output_dir={tmp_path}"])
    card = me.model_card(RunDir.create(tmp_path, cfg))
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card and "de-quantized" in card


def test_safetensors_f16_export_folder_loads_and_matches(tmp_path, tokenizer):
    from transformers import AutoModelForCausalLM

    run = finished_run(tmp_path / "runs", tokenizer)
    res = me.export_run(run, "safetensors", "f16")
    assert res.folder == run.path / "export" / "safetensors-f16"
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md", "training_config.yaml",
            me.MARKER} <= set(res.files) == {p.name for p in res.folder.iterdir()}
    assert json.loads((res.folder / me.MARKER).read_text())["quant"] == "f16"
    assert (res.folder / "training_config.yaml").read_text() == run.config_path.read_text()
    back = AutoModelForCausalLM.from_pretrained(res.folder)
    assert back.dtype == torch.float16
    ids = tokenizer(TEXTS[2], return_tensors="pt")["input_ids"]
    ref = _logits(AutoModelForCausalLM.from_pretrained(run.final_dir), ids)
    got = _logits(back.float(), ids)
    assert (got - ref).abs().max().item() <= 0.01 * ref.std().item()


def test_export_never_replaces_a_folder_it_did_not_write(tmp_path, tokenizer):
    run = finished_run(tmp_path / "runs", tokenizer)
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(me.ExportError, match="not empty and is not an earlier export"):
        me.export_run(run, "gguf", "f16", other)
    assert [p.name for p in other.iterdir()] == ["notes.txt"]
    first = me.export_run(run, "gguf", "q8_0", tmp_path / "out")
    again = me.export_run(run, "gguf", "q8_0", tmp_path / "out")  # an earlier export is replaced whole
    assert again.path == first.path and again.path.is_file()
    with pytest.raises(me.ExportError, match="can be written as f32, f16"):
        me.export_run(run, "safetensors", "q8_0")
    unfinished = RunDir.create(tmp_path / "runs", load_config("tests/configs/tiny.yaml"))
    with pytest.raises(me.ExportError, match="has no trained model yet"):
        me.export_run(unfinished, "gguf", "f16")


# ------------------------------------------------------------------------------------------------
# The Hub, up to the network call
# ------------------------------------------------------------------------------------------------
class FakeApi:
    calls: list = []
    fail: Exception | None = None

    def __init__(self, token=None):
        FakeApi.calls.append(("init", token))

    def create_repo(self, repo_id, **kw):
        FakeApi.calls.append(("create_repo", repo_id, kw))

    def upload_folder(self, **kw):
        if FakeApi.fail is not None:
            raise FakeApi.fail
        FakeApi.calls.append(("upload_folder", kw))


@pytest.fixture
def exported(tmp_path, tokenizer):
    run = finished_run(tmp_path / "runs", tokenizer)
    return me.export_run(run, "safetensors", "f32")


def _snapshot(folder):
    return {p.name: p.stat().st_size for p in folder.iterdir()}


def test_push_offline_says_so_and_keeps_the_export(exported, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before = _snapshot(exported.folder)
    with pytest.raises(me.ExportError) as e:
        me.push_to_hub(exported.folder, "someone/tiny-grpo", shown="export/safetensors-f32")
    assert str(e.value) == (
        "Not pushed: this server runs offline (HF_HUB_OFFLINE is set). Nothing was lost: the export stays in "
        "export/safetensors-f32; push it when online."
    )
    assert _snapshot(exported.folder) == before


def test_push_calls_the_hub_api_with_the_folder(exported, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(me, "hub_offline_reason", lambda: None)
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    FakeApi.calls, FakeApi.fail = [], None
    url = me.push_to_hub(exported.folder, "someone/tiny-grpo", token="hf_x", private=True)
    assert url == "https://huggingface.co/someone/tiny-grpo"
    assert FakeApi.calls[0] == ("init", "hf_x")
    assert FakeApi.calls[1] == ("create_repo", "someone/tiny-grpo", {"repo_type": "model", "private": True,
                                                                    "exist_ok": True})
    up = FakeApi.calls[2][1]
    assert up["folder_path"] == str(exported.folder) and up["repo_id"] == "someone/tiny-grpo"

    FakeApi.fail = ConnectionError("Max retries exceeded with url: /api/repos/create")
    before = _snapshot(exported.folder)
    with pytest.raises(me.ExportError, match=r"^Not pushed: the Hub said: Max retries exceeded.*Nothing was lost"):
        me.push_to_hub(exported.folder, "someone/tiny-grpo", shown="x")
    assert _snapshot(exported.folder) == before
    with pytest.raises(me.ExportError, match="not a Hub repo id"):
        me.push_to_hub(exported.folder, "no spaces/allowed here")
    with pytest.raises(me.ExportError, match="not an export folder"):
        me.push_to_hub(exported.folder.parent, "someone/tiny-grpo")


# ------------------------------------------------------------------------------------------------
# The command line
# ------------------------------------------------------------------------------------------------
def test_cli_export(tmp_path, tokenizer, capsys, monkeypatch):
    from grpo_app.cli import main

    root = tmp_path / "runs"
    run = finished_run(root, tokenizer)
    assert main(["export", run.id, "--runs-dir", str(root), "--format", "gguf", "--quant", "q8_0"]) == 0
    out = capsys.readouterr().out
    path = run.path / "export" / "gguf-q8_0" / f"{run.id}-q8_0.gguf"
    assert path.is_file() and f"Exported {run.id} as gguf q8_0: {path}" in out
    single = tmp_path / "one.gguf"
    assert main(["export", run.id, "--runs-dir", str(root), "--out", str(single)]) == 0
    assert single.is_file() and "as GGUF f16" in capsys.readouterr().out

    for argv, message in (
        (["export", run.id, "--format", "safetensors", "--quant", "q8_0"], "safetensors can be written as f32, f16"),
        (["export", "no-such-run"], "is no run 'no-such-run'"),
        (["export", "../etc"], "is not a run id"),
        (["export", run.id, "--format", "onnx"], "format 'onnx' is not one of gguf, safetensors"),
    ):
        assert main([*argv, "--runs-dir", str(root)]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and err.count("\n") == 1, err

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = main(["export", run.id, "--runs-dir", str(root), "-f", "safetensors", "--push", "someone/tiny-grpo"])
    captured = capsys.readouterr()
    folder = run.path / "export" / "safetensors-f32"
    assert code == 2 and "Not pushed: this server runs offline" in captured.err and str(folder) in captured.err
    assert (folder / "model.safetensors").is_file() and (folder / "README.md").is_file()


def test_cli_export_refuses_a_symlinked_run_id_as_the_app_does(tmp_path, tokenizer, capsys):
    """Issue 45, 2: a run folder that is a link to elsewhere is not a run (`runs.resolve_run`), so nothing is
    loaded from it and nothing is written there."""
    from grpo_app.cli import main

    elsewhere = finished_run(tmp_path / "elsewhere", tokenizer)
    root = tmp_path / "runs"
    root.mkdir()
    link = root / "20990101-000000-linked"
    link.symlink_to(elsewhere.path, target_is_directory=True)
    assert main(["export", link.name, "--runs-dir", str(root), "--format", "gguf", "--quant", "q8_0"]) == 2
    err = capsys.readouterr().err
    assert "There is no run '20990101-000000-linked'" in err and "Traceback" not in err and err.count("\n") == 1
    assert not (elsewhere.path / "export").exists()


@pytest.mark.parametrize("target, words", [
    ("/dev/full/x.gguf", "a part of the path is a file, not a folder"),  # a path under a file
    ("/proc/x.gguf", "no such folder"),  # a pseudo file system takes no new file
    ("/dev/full/sub/x", "a part of the path is a file, not a folder"),  # a folder export under a file
])
def test_cli_export_to_an_unwritable_place_says_so_in_one_line(tmp_path, tokenizer, capsys, monkeypatch, target, words):
    """Issue 45, 3: one line and exit 2, before the model is even loaded."""
    from grpo_app.cli import main

    monkeypatch.setattr(me, "load_trained", lambda run: pytest.fail("loaded the model for a target it cannot write"))
    root = tmp_path / "runs"
    run = finished_run(root, tokenizer)
    assert main(["export", run.id, "--runs-dir", str(root), "--out", target]) == 2
    err = capsys.readouterr().err
    assert err == f"Cannot export: could not write {target}: {words}\n", err


@pytest.mark.parametrize("out_name", ["one.gguf", "folder"])
def test_cli_export_on_a_disk_that_fills_mid_write_leaves_no_partial_file(tmp_path, tokenizer, capsys, monkeypatch,
                                                                           out_name):
    """Issue 45, 3: the disk fills after some bytes are written: one line, exit 2, nothing left behind."""
    import errno

    from grpo_app.cli import main

    def fill_up(model, tok, path, quant, name=None):
        with open(path, "wb") as fh:
            fh.write(b"GGUF" + b"\0" * 4096)
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(me, "write_gguf", fill_up)
    root = tmp_path / "runs"
    run = finished_run(root, tokenizer)
    out = tmp_path / "out"
    out.mkdir()
    assert main(["export", run.id, "--runs-dir", str(root), "--out", str(out / out_name)]) == 2
    err = capsys.readouterr().err
    assert err == f"Cannot export: could not write {out / out_name}: disk full\n", err
    assert list(out.iterdir()) == []  # neither the target nor a temporary file
