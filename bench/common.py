"""What the benches share: running one setup in a child process, and printing / saving the result."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path


def run_child(script: str, args: list[str], label: str) -> dict:
    """Run `python script *args` (the setup in a process of its own, so its peak RSS is its own) and
    return the JSON object on the last line of its stdout; exit with its stderr if it failed."""
    p = subprocess.run([sys.executable, script, *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{label} failed:\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def emit(res: dict, out: str | None) -> None:
    """Print the result as JSON, and write it to `out` too when given."""
    text = json.dumps(res, indent=2)
    print(text)
    if out:
        Path(out).write_text(text + "\n")


def machine() -> dict:
    """The machine a result was measured on: processor (its name and the vector instruction set torch's
    kernels use there), cores, torch, and the GPU if one is visible."""
    import torch

    from grpo_app.core.system import cpu_kernels, cpu_name

    return {
        "cpu": platform.processor() or platform.machine(),
        "cpu_name": cpu_name(),
        "cpu_kernels": cpu_kernels(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
