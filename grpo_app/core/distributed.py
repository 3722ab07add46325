"""Data-parallel training in several processes (`torchrun`, `accelerate launch`): where they must agree.

Every process holds a full replica, samples its own prompts (`grpo.prompts_per_step` is per process)
and DDP averages the gradients, so the replicas take identical steps. Beyond that, the engine's
processes share:

* the run folder: the first process (rank 0) creates it and writes every file in it (metrics, events,
  checkpoints, EWC state, final model); the others receive its path and write nothing there, except
  the per-process RNG state that HF puts in each checkpoint;
* the Fisher: each process estimates it on its own completions and the estimates are averaged, so
  every replica applies the same EWC penalty (with separate estimates the replicas would drift apart);
* stop requests: rank 0's stop flag is combined with the others' at every step end, so all stop at
  the same step.

At the end of training the replicas' weights are compared (`check_replicas`): replicas that differ
are an error, not a result, and every process leaves the group (`shutdown`) before it exits. Without a
process group every helper here is a no-op.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from grpo_app.core.env import env_int


def world_size() -> int:
    """Processes in this training job: the process group's size, else what the launcher set."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return env_int("WORLD_SIZE", 1)


def rank() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return env_int("RANK", 0)


def local_processes() -> int:
    """Processes the launcher started on this machine (1 without a launcher)."""
    return max(1, env_int("LOCAL_WORLD_SIZE", 1))


def is_main() -> bool:
    return rank() == 0


def active() -> bool:
    """True inside a process group of more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def init(device: str = "auto") -> None:
    """Join the process group the launcher describes (gloo on CPU, NCCL on CUDA); each process on CUDA
    uses the GPU of its local rank. A no-op for a single process or a group that is already up."""
    if world_size() <= 1 or (dist.is_available() and dist.is_initialized()):
        return
    from accelerate import PartialState

    cpu = device == "cpu" or not torch.cuda.is_available()
    if not cpu:
        torch.cuda.set_device(env_int("LOCAL_RANK", 0))
    PartialState(cpu=cpu)


def shutdown() -> None:
    """Leave the process group, on every process, once its work is done (also after an error). PyTorch asks
    for it before exit: left to the interpreter's teardown, gloo's worker threads can still hold tensors
    when Python is being torn down, and a process that finished its work dies of SIGABRT (as described in
    pytorch/pytorch#179291). Seen here once before this was added: a worker of the two-process test in a
    fresh-clone CI of 2026-11-30 (not reproduced in 10 reruns)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def barrier() -> None:
    if active():
        dist.barrier()


def broadcast(obj):
    """rank 0's `obj`, on every process (any picklable value)."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def any_true(flag: bool) -> bool:
    """True on every process if `flag` is true on any of them."""
    if not active():
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def average_(tensors: dict[str, torch.Tensor]) -> None:
    """Replace each tensor by its mean over the processes, in place (every process gets the same bits)."""
    if not active():
        return
    n = dist.get_world_size()
    dev = _device()
    for t in tensors.values():
        buf = t.to(dev)
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        t.copy_(buf.div_(n))


def check_replicas(model) -> dict:
    """Compare every process's trainable weights (a float64 sum and sum of squares per tensor).

    Returns {"processes": n, "tensors": m, "max_difference": d}; raises RuntimeError when the replicas
    differ, since the run would then not be one model."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not active():
        return {"processes": 1, "tensors": len(params), "max_difference": 0.0}
    dev = _device()
    with torch.no_grad():
        mine = torch.stack(
            [torch.stack([p.detach().double().sum(), p.detach().double().pow(2).sum()]) for p in params]
        ).to(dev)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    diff = max(float((o - everyone[0]).abs().max()) for o in everyone)
    if diff != 0.0:
        raise RuntimeError(
            f"the {len(everyone)} training processes ended with different weights (largest difference in a "
            f"per-tensor checksum: {diff:.3g}); the run is not one model. Please report this with the run's events."
        )
    return {"processes": len(everyone), "tensors": len(params), "max_difference": diff}
