"""`grpo.keep_freed_memory` (optim.held_heap): freed memory stays in the process, trims are skipped, glibc's
thresholds come back on exit, and a run computes the same weights bit for bit either way."""

from __future__ import annotations

import contextlib
import ctypes.util
import resource
import sys

import pytest
import torch
from safetensors.torch import load_file

from grpo_app.core.config import load_config
from grpo_app.core.run_folder import RunDir
from grpo_app.training import engine, optim


class FakeLibc:
    def __init__(self):
        self.calls = []

    def mallopt(self, param, value):
        self.calls.append(("mallopt", param, value))
        return 1

    def malloc_trim(self, pad):
        self.calls.append(("trim",))
        return 1


def test_held_heap_sets_the_thresholds_skips_trims_and_restores_glibcs_defaults(monkeypatch):
    libc = FakeLibc()
    monkeypatch.setattr(optim, "_LIBC", libc)
    assert optim.trim_heap() is True and libc.calls == [("trim",)]
    libc.calls.clear()
    with optim.held_heap() as held:
        assert held is True
        assert libc.calls == [
            ("mallopt", optim.M_MMAP_THRESHOLD, optim.HELD_MMAP_THRESHOLD),
            ("mallopt", optim.M_TRIM_THRESHOLD, optim.HELD_TRIM_THRESHOLD),
        ]
        libc.calls.clear()
        assert optim.trim_heap() is False and libc.calls == []  # skipped while held
    assert libc.calls == [
        ("mallopt", optim.M_TRIM_THRESHOLD, optim.DEFAULT_TRIM_THRESHOLD),
        ("mallopt", optim.M_MMAP_THRESHOLD, optim.DEFAULT_MMAP_THRESHOLD),
        ("trim",),  # once, on the way out
    ]
    libc.calls.clear()
    with optim.held_heap(False) as held:
        assert held is False and optim.trim_heap() is True
    assert libc.calls == [("trim",)]


def test_held_heap_holds_nothing_when_mallopt_refuses(monkeypatch):
    libc = FakeLibc()
    libc.mallopt = lambda param, value: 0
    monkeypatch.setattr(optim, "_LIBC", libc)
    with optim.held_heap() as held:
        assert held is False
        assert optim.trim_heap() is True  # nothing held: trims go on


PR_SET_THP_DISABLE = 41  # linux/prctl.h


@contextlib.contextmanager
def _small_pages_only():
    """Counts below are of 4 KiB pages: with transparent huge pages on ("always", as on some CI hosts, or torch's
    THP_MEM_ALLOC_ENABLE), one fault maps 2 MiB and a trimmed round costs a few faults, not ~2,000. Switch them off
    for this process while counting, and back on after."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
        pytest.skip("this kernel cannot switch transparent huge pages off for a process")
    try:
        yield
    finally:
        libc.prctl(PR_SET_THP_DISABLE, 0, 0, 0, 0)


def _faults_of_refilled_blocks(rounds: int = 12, mb: int = 8) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        t = torch.empty(mb * 2**18).fill_(1.0)  # mb MB, every page touched
        del t
        optim.trim_heap()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(ctypes.util.find_library("c") is None or sys.platform != "linux",
                    reason="needs Linux and its C library")
def test_with_the_heap_held_a_freed_block_is_reused_without_new_page_faults():
    """The real glibc: 8 MB filled and freed 12 times, a trim after each. Trimmed, every round faults its pages in
    again (~2,000 a round); held, the block stays and only the first round faults."""
    pages = 8 * 2**20 // resource.getpagesize()
    with _small_pages_only():
        trimmed = _faults_of_refilled_blocks()
        with optim.held_heap() as held:
            if not held:
                pytest.skip("this C library has no mallopt")
            kept = _faults_of_refilled_blocks()
    assert trimmed > 6 * pages  # the pages came back through the kernel round after round
    assert kept < 3 * pages


def test_a_run_with_the_heap_held_trains_the_same_weights_bit_for_bit(tmp_path, varied_reward):
    seen = {}

    class Watch(engine.Observer):
        def __init__(self, key):
            self.key = key

        def step_end(self, model, step, stage):
            seen.setdefault(self.key, set()).add(optim._HELD)

    finals = {}
    for keep in (False, True):
        cfg = load_config("tests/configs/tiny.yaml", [f"run.output_dir={tmp_path / str(keep)}", "run.save_every=0",
                                                      "rewards.weights={text_length: 1.0}",
                                                      f"grpo.keep_freed_memory={str(keep).lower()}"])
        run = RunDir.create(tmp_path / str(keep), cfg)
        assert engine.train(cfg, run, observers=[Watch(keep)]) == "completed"
        finals[keep] = load_file(str(run.final_dir / "model.safetensors"))
    assert seen == {False: {False}, True: {True}}  # held through the run's steps, and only in the run that asks
    assert optim._HELD is False  # let go when the run ended
    assert finals[True].keys() == finals[False].keys()
    assert all(torch.equal(finals[True][n], finals[False][n]) for n in finals[False])
