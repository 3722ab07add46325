"""CurriculumGRPOTrainer: TRL's GRPOTrainer with CPU-minded changes and an EWC term.

What differs from `trl.GRPOTrainer` (everything else — rewards, advantages, the clipped loss,
logging, checkpoints, resume — is TRL's own code):

1. Generation uses `generation.generate_completions` (same model, same sampling distribution:
   temperature / top-p / top-k; a group's prompt is prefilled once). A completion that ends with an end
   token keeps it, as TRL's does (`<= eos_idx`), so the end token is in the loss: the model is trained on
   when to stop. With `stop_at_answer`, a completion ends when its '#### <number>' line is complete: it
   has sampled no end token there, so none is trained on (the model is not taught to stop after its answer
   line, only rewarded for the line), and TRL's `completions/clipped_ratio` counts it as clipped (our
   `gen/truncated_ratio` counts only those cut by the length budget). With `packed_sampling` (off by
   default; on in the progressive preset) every float32 Linear samples on a copy of its weight that oneDNN packed once per step
   (`sampler.packed_linears`): the same model and distribution up to float rounding, though a near-tie can
   sample another token than the plain product would (measured: the progressive preset on seed 42 sampled the
   same tokens for 9 steps, then went another way; docs/performance.md; on an AVX-512 host, seeds 1, 2, 42
   parted at steps 2, 10, 13; docs/experiments.md).
2. The generation batch is split into micro-batches without shuffling, so each micro-batch holds
   whole groups (needed by 3 and 4).
3. Log-probabilities: each distinct prompt (but its last token) runs once, its keys/values are
   reused by the G completions, and the LM head projects only completion positions (TRL's CPU
   path projects every position, prompt included). Same numbers, fewer FLOPs. The engine's own layer
   recompute (`lean.layer_hooks`) keeps this path; HF's gradient checkpointing drops a cache while
   training, so with it TRL's path is taken. With `bucket_lengths`, the completions then run in a few
   buckets of similar length, each cut to its longest row, instead of all padded to the longest completion
   of the whole generation batch (TRL pads every row to it): same numbers but for float rounding (the
   positions dropped are padding, which no real token attends to), fewer FLOPs when lengths differ,
   as they do once some completions stop at their answer line (`length_buckets`). Every bucket but the
   last runs on aliases of the weights, like the prompt pass, so several buckets are single process
   only; with several processes all rows run as one bucket, still cut to its longest row.
   On a CPU, TRL's fused LM head keeps each tile of logits it projects for the backward pass instead of
   projecting it again there (`lm_head.KeptTilesLogProb`, TRL's own tile code otherwise): equal bit for bit,
   one matrix product fewer per tile, for the micro-batch's logits held until its backward (within
   `estimate.KEPT_LOGITS_BYTES`; beyond it, TRL's path). Measured: the progressive preset's runs of seeds 2, 1
   and 42 trained again gave byte-identical final models; seed 2's groups replayed, the training pass 0.969x
   as long (bench/bucket_lengths.py '/reproject'; docs/experiments.md, 2026-12-02).
4. With beta = 0 and no entropy bonus, a completion whose advantage is 0 contributes exactly 0 to
   the loss and its gradient; its forward/backward is skipped and the loss is rescaled so the
   result is identical (dapo needs no rescale: its normalizer counts the whole generation batch).
   Single process only: TRL gathers per-row tensors across processes, which needs equal row counts.
   A group whose answers all earned the same total has advantages of exactly 0 here. In TRL they are
   float32 residue: the group mean of equal totals that are not binary fractions (0.4 = 0.3 + 0.1; 1.9)
   can miss them in the last bit, and dividing by the group's std (~1e-8) + 1e-4 turns that into about
   +-1e-3 (+0.0012 for every answer of an all-right group under the classroom weights), so those rows were
   trained on with that tiny push and TRL's `frac_reward_zero_std` did not count the group. Measured on
   the progressive preset's runs of 2026-12-01/02: 7-23 of each run's 112 groups had equal totals and
   none was skipped or counted. `_zero_equal_groups` sets them to 0 (single process). Measured against
   TRL's values: seed 2's run replayed (bench/bucket_lengths.py, '/trl0'), the training pass ran 0.876x the
   positions in 0.772x the time; trained again, the run sampled the same tokens for 13 steps, then drifted
   as float rounding does (docs/experiments.md, 2026-12-02).
5. The EWC penalty lambda/2 * sum F (theta - theta*)^2 (lambda: the config's `ewc.lam`) is added to the
   loss once per optimizer step and logged as `ewc_penalty`. Its gradient is added to the parameters'
   gradients after clipping, just before the optimizer step (`ewc_clip_penalty=False` here, the config's
   `ewc.clip_penalty: false`, the default); with `ewc.clip_penalty: true` it is clipped with the rest.
6. Checkpoints are written to a staging folder and renamed into place when complete.
7. A stop asked inside a step (`should_abort`) abandons that step: checked between decode steps of the
   sampling, after it, and before each micro-batch's forward/backward, it raises `StepAborted` out of
   TRL's loop. Nothing of the abandoned step is applied (the optimizer has not stepped, so weights,
   moments and schedule are still those of the last complete step); the engine then keeps, or writes,
   the checkpoint of the last complete step. Single process only: a stop there is decided collectively
   at step ends (`distributed.any_true`), and one process leaving a step alone would hang the others.
   The longest stretch it cannot cut is one micro-batch's forward and backward.
8. With `force_answer_line` > 0 (off by default), that share of the completions that end without a
   '#### <number>' line get "\n####" written in place of their end token and sample on: the policy picks
   the number. With `force_answer_line_loss = "train"` those forced tokens are trained on as if sampled
   (TRL's ratio is 1 at the first pass; the sampler's probability of a forced token was 1, not the
   policy's, so this is off-policy there, as guided rollouts are; no importance weight corrects it). With
   "mask" they are left out of the loss through TRL's own `tool_mask` (as TRL leaves out a tool's output):
   the completion is scored whole, and only the tokens the model sampled, before and after the hint, are
   trained. Why force at all: the answer line is a rare event for the embedded model (~1% of sampled
   answers, docs/experiments.md), and GRPO can only reinforce what is sampled. Forced completions are marked
   with their span wherever completions are shown (step records: `forced`), and the share is charted.
   Compare, Try and exports never force anything: what is measured is what the model learned. An answer run
   on at the end of a line ('134.#### 134') has no line of its own, so it is forced too, and the hint then
   earns it the whole format reward; with `force_answer_line_run_on = False` only endings with no '####'
   answer are forced, and a run-on is scored as written (it loses the strict format reward every time).
9. With beta > 0, the KL term's reference is the policy as the stage began (the engine passes a frozen copy;
   resumed inside a stage, the stage's start is read from the weights the run kept at the previous stage's
   end). TRL would load the reference again from the model's hub id or folder: in a curriculum that is the
   run's starting model in every stage, so later stages would be pulled back towards the base model, and a
   model without a folder (the tests' tiny random one) could not have one. Per trainer this is TRL's own
   rule, the reference is the model the trainer was given. With LoRA, TRL's reference is kept: the model
   with its adapters off, i.e. the base model, in every stage.
10. With a stage's `replay_beta` unlike its `beta`, the KL coefficient is one per row (TRL has one per run):
   the rows of problems replayed from earlier stages get `replay_beta`, the stage's own rows `beta` (e.g. 0:
   a KL term that holds the earlier stages' answers where the stage began, the idea of Learning without
   Forgetting, without braking the stage's own task). Each micro-batch's loss is TRL's, computed once per
   coefficient on that coefficient's rows and summed with the rescale of 4 (the same number as one pass with a
   per-row coefficient would give). TRL's logged `kl` is then the mean over the rows whose coefficient is not 0,
   and its entropy and clip ratios are averaged over the parts rather than over all tokens at once. Single
   process only (each process would hold a different number of rows per coefficient).
11. With a stage's `carry_moments`, its AdamW starts from the moments the previous stage's optimizer ended with
   (`initial_moments`: both running averages and their step count, so no bias correction restarts), under this
   stage's own learning rate and schedule. TRL, like every `Trainer`, builds a fresh optimizer per trainer, and
   the engine builds one trainer per stage, so by default each stage's first updates are a fresh Adam's: about
   the learning rate on every weight, whatever the size of its gradient. Resumed at a stage's end, the moments
   are read from the optimizer state of the checkpoint of that stage's last step (TRL's own `optimizer.pt`);
   resumed inside the stage, the checkpoint's state replaces them, as in any resume.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch
import trl.trainer.utils as _trl_utils
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from trl import GRPOTrainer

from grpo_app.core.fileio import publish_dir
from grpo_app.training import lm_head
from grpo_app.training.advantages import equal_groups
from grpo_app.training.estimate import KEPT_LOGITS_BYTES, LOGPROB_CHUNK  # (one value each: training and estimate)
from grpo_app.training.optim import AdamWBF16Moments, load_moments, trim_heap
from grpo_app.training.sampler import SamplingParams, generate_completions


class StepAborted(Exception):
    """A stop was asked inside a step; the step is abandoned (departure 7). `where` says what it was doing."""

    def __init__(self, where: dict):
        super().__init__(f"step abandoned during {where.get('what')}")
        self.where = dict(where)

# TRL's fused LM head projects the positions onto 32768 vocabulary columns per tile (TRL 1.16: tiles of up to
# 4096 positions x `_CHUNKED_LOGPROB_CHUNK_SIZE` columns): a [positions, 32768] float32 tile and its softmax
# temporaries. 512 columns keep the GEMMs efficient and the peak small (measured when this was set, with TRL's
# chunking of the day: backward peak RSS 3.1 -> 2.6 GB, same step time). On a CPU the training pass keeps the
# tiles for backward instead of projecting them again (departure 3, `lm_head`).
if hasattr(_trl_utils, "_CHUNKED_LOGPROB_CHUNK_SIZE"):
    _trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE = min(_trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE, LOGPROB_CHUNK)
lm_head.install()


@dataclass
class EngineOptions:
    fast_generation: bool = True
    packed_sampling: bool = False  # sample on oneDNN-packed copies of the weights (sampler.packed_linears)
    stop_at_answer: bool = True
    share_prompt_prefix: bool = True
    skip_zero_advantage: bool = True
    top_k: int = 0
    recent_samples: int = 256  # (prompt, completion) pairs kept for a sampled Fisher
    optimizer: str = "adamw_bf16_moments"  # or "adamw" (torch.optim.AdamW, fp32 moments)
    trim_heap: bool = True  # give freed memory back to the OS after generation and each step
    merge_lora: bool = True  # with a peft model: merge adapters for sampling, unmerge for training
    bucket_lengths: bool = True  # training pass: completions in buckets of similar length, padding cut (3)
    bucket_overhead: int = 64  # what one more bucket costs, in padded positions (see length_buckets)
    force_answer_line: float = 0.0  # share of line-less endings given "\n####" to finish (8)
    force_answer_line_loss: str = "train"  # "train" the forced tokens like sampled ones, or "mask" them out (8)
    force_answer_line_run_on: bool = True  # also force endings whose answer is run on, '134.#### 134' (8)
    keep_lm_head_logits: bool = True  # training pass on a CPU: LM-head logits kept for backward, not projected again (3)


def _unwrap_peft(model):
    try:
        from peft import PeftModel

        if isinstance(model, PeftModel):
            return model.get_base_model()
    except ImportError:  # pragma: no cover
        pass
    return model


@contextlib.contextmanager
def lora_merged(model, enabled: bool = True):
    """Sample with LoRA adapters merged into the base weights (W + s*B@A), then unmerge them.

    Merged, each adapted Linear is one matmul instead of three plus peft's Python around them; unmerging
    subtracts the same delta, so the base weights come back to within float32 rounding (checked in the
    tests). A no-op for models without adapters, or when disabled.
    """
    from peft import PeftModel  # a requirement of the project

    if not enabled or not isinstance(model, PeftModel):
        yield model
        return
    with torch.no_grad():
        model.merge_adapter()
    try:
        yield model
    finally:
        with torch.no_grad():
            model.unmerge_adapter()


def _checkpointing(model, accelerator) -> bool:
    """HF's gradient checkpointing on (the engine uses `lean.layer_hooks` instead): HF's checkpointed layers
    then set past_key_values=None while training, so a cached prompt would silently vanish."""
    lm = _unwrap_peft(accelerator.unwrap_model(model))
    flag = getattr(lm, "is_activation_checkpointing", None)
    if flag is None:
        flag = getattr(lm, "is_gradient_checkpointing", False)
    return bool(flag) and lm.training


class PromptRecordLayer(DynamicLayer):
    """KV layer for a pass that starts from an empty cache: `update` returns the new keys/values unchanged
    (what DynamicLayer returns when empty) and keeps those of the first call."""

    replay_safe = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.dtype, self.device = key_states.dtype, key_states.device
            self.keys, self.values, self.is_initialized = key_states, value_states, True
        return key_states, value_states


class PrefixLayer(DynamicLayer):
    """KV layer holding a fixed prefix: `update` returns prefix + the new keys/values without storing them,
    so a second call with the same input gives the same result.

    With `rows`, `keys`/`values` hold each distinct prompt once and row b continues prompt rows[b]: the
    rows' copies are made inside `update`, so they live only while the layer runs (and again in its
    recompute) instead of for the whole forward and backward: for 8 completions after a 160-token prompt
    that is ~60 MB of SmolLM2 keys/values no longer held across the 30 layers."""

    replay_safe = True

    def __init__(self, keys, values, rows: torch.Tensor | None = None):
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self.keys, self.values, self.rows, self.is_initialized = keys, values, rows, True

    def update(self, key_states, value_states, *args, **kwargs):
        keys, values = self.keys, self.values
        if self.rows is not None:
            keys, values = keys.index_select(0, self.rows), values.index_select(0, self.rows)
        return torch.cat([keys, key_states], dim=-2), torch.cat([values, value_states], dim=-2)


def length_buckets(lengths: list[int], overhead: int) -> list[list[int]]:
    """Rows grouped into buckets that run one forward each, cut to the bucket's longest row: the split of the
    rows sorted by length that minimises sum(rows x longest) + overhead per bucket, `overhead` being what one
    more bucket costs in padded positions (per-call work of every layer and its recompute, the prefix
    keys/values copied per row, smaller matrix multiplies; EngineOptions.bucket_overhead, measured with
    bench/bucket_lengths.py). An exact dynamic programme over the sorted lengths (a micro-batch has a few
    dozen rows). Returns row indices, shortest bucket first."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    ls = [lengths[i] for i in order]
    n = len(ls)
    best, cut_at = [0.0] + [float("inf")] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            cost = best[i] + (j - i) * ls[j - 1] + overhead
            if cost < best[j]:
                best[j], cut_at[j] = cost, i
    buckets, j = [], n
    while j > 0:
        buckets.append(order[cut_at[j] : j])
        j = cut_at[j]
    return buckets[::-1]


def _fold_grad(param, alias) -> None:
    grad, alias.grad = alias.grad, None
    if param.grad is None:
        param.grad = grad
    else:
        param.grad.add_(grad)


def _grad_aliases(module) -> dict[str, torch.Tensor]:
    """For each trainable parameter of `module`, a leaf tensor sharing its storage whose gradient is added to
    the parameter's own the moment backward produces it.

    Every weight is used twice in a shared-prefix pass: by the prompt pass and by the completions'. Autograd
    sums a parameter's incoming gradients in a buffer until all its uses have been differentiated, and the
    prompt pass is differentiated last, so while a micro-batch's gradients are being added to earlier
    micro-batches' (gradient accumulation), a second full set of weight gradients (~400 MB for SmolLM2)
    waits in those buffers for the whole backward. With the prompt pass on aliases each use has its own
    leaf, and each gradient is folded in as soon as it exists. Same sum (in another order: float rounding).
    Single process only: DDP's gradient hooks are on the parameters, not on the aliases.
    """
    out = {}
    for name, param in module.named_parameters():
        if param.requires_grad:
            alias = param.detach().requires_grad_(True)
            alias.register_post_accumulate_grad_hook(functools.partial(_fold_grad, param))
            out[name] = alias
    return out


def _layer_cache(layers) -> DynamicCache:
    cache = DynamicCache()
    cache.layers, cache.layer_class_to_replicate = list(layers), None
    return cache


def _num_layers(lm) -> int:
    cfg = lm.config.get_text_config() if hasattr(lm.config, "get_text_config") else lm.config
    return cfg.num_hidden_layers


def restore_forward(model) -> None:
    """Undo TRL's `add_fused_lm_head` instance patch (each new trainer adds one)."""
    _unwrap_peft(model).__dict__.pop("forward", None)


@contextlib.contextmanager
def _reference_from(ref_model):
    """While TRL's __init__ runs, its `create_model_from_path` (which builds the reference when beta > 0)
    returns `ref_model` instead of loading a model; TRL then prepares it as its own (dropout off, fused LM head,
    accelerator). Departure 9."""
    import trl.trainer.grpo_trainer as grpo_module

    if ref_model is None:
        yield
        return
    original = grpo_module.create_model_from_path
    grpo_module.create_model_from_path = lambda *a, **k: ref_model
    try:
        yield
    finally:
        grpo_module.create_model_from_path = original


class CurriculumGRPOTrainer(GRPOTrainer):
    def __init__(
        self,
        *args,
        ewc=None,
        ewc_clip_penalty: bool = False,
        engine_options: EngineOptions | None = None,
        reward_weights: list[float] | None = None,
        on_group=None,
        checkpoint_hook=None,
        should_abort=None,
        on_activity=None,
        ref_model=None,
        kl_rows: dict | None = None,
        initial_moments: dict | None = None,
        **kwargs,
    ):
        self.ewc = ewc
        self.initial_moments = initial_moments  # 11. an earlier stage's optimizer state_dict, or None (fresh)
        self.kl_rows = kl_rows  # 10. {"own": beta, "replayed": beta, "ids": replayed problem ids}, or None
        self.ewc_clip_penalty = ewc_clip_penalty  # the config's ewc.clip_penalty (5)
        self.opts = engine_options or EngineOptions()
        self.on_group = on_group  # callable(dict) with the latest group, after each generation
        self.checkpoint_hook = checkpoint_hook  # callable(folder) to add files before a checkpoint is published
        self.should_abort = should_abort  # callable() -> bool: abandon the step in progress (7)
        self.on_activity = on_activity  # callable(dict): what the step is doing now (for a stop to say)
        self.activity: dict = {"what": "starting"}
        self.recent_samples: deque = deque(maxlen=self.opts.recent_samples)
        self._staging_dir: str | None = None
        self._ewc_step = -1
        self.gen_totals = {"seconds": 0.0, "tokens": 0, "completions": 0}
        self._forced_at: list[list[int]] = []  # 8. per row of the last generation: positions of forced tokens
        self._forced_chars: list[list[int] | None] = []  # 8. per row: [start, end) of the forced span in its text
        with _reference_from(ref_model):  # 9. TRL would load the reference again from the model's hub id or path
            super().__init__(*args, **kwargs)
        # The engine reports metrics itself; HF's printer would dump every log dict to stdout.
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        self.remove_callback(PrinterCallback)
        self.remove_callback(ProgressCallback)
        if kl_rows is not None and self.accelerator.num_processes > 1:
            raise ValueError("a stage's replay_beta unlike its beta needs one process (each process would hold a "
                             "different number of rows per coefficient); train on one, or set replay_beta = beta.")
        if reward_weights is not None:  # this stage's weights (TRL's reward_weights are one list per run)
            self.reward_weights = torch.tensor(reward_weights, dtype=torch.float32)

    def create_optimizer(self, model=None):
        had = self.optimizer is not None
        opt = self._create_optimizer(model)
        if not had and self.initial_moments is not None:  # 11. (a checkpoint resumed from loads its own after this)
            load_moments(opt, self.initial_moments)
            self.initial_moments = None
        if not had and self.ewc is not None and self.ewc.active and not self.ewc_clip_penalty:
            opt.register_step_pre_hook(self._ewc_grad_hook)  # runs after clip_grad_norm_, before the update
        return opt

    def _ewc_grad_hook(self, optimizer, args, kwargs):
        t0 = time.perf_counter()
        self.ewc.add_penalty_grad(self.accelerator.unwrap_model(self.model))
        spent = self._metrics["train"]["ewc_seconds"]  # this step's entry, from the penalty value in the loss
        if spent:
            spent[-1] += time.perf_counter() - t0
        else:
            spent.append(time.perf_counter() - t0)

    def _create_optimizer(self, model=None):
        if self.optimizer is None and self.opts.optimizer == "adamw_bf16_moments":
            opt_model = self.model if model is None else model
            decay = set(self.get_decay_parameter_names(opt_model))
            named = [(n, p) for n, p in opt_model.named_parameters() if p.requires_grad]
            groups = [
                {"params": [p for n, p in named if n in decay], "weight_decay": self.args.weight_decay},
                {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
            ]
            self.optimizer = AdamWBF16Moments(
                [g for g in groups if g["params"]],
                lr=self.args.learning_rate,
                betas=(self.args.adam_beta1, self.args.adam_beta2),
                eps=self.args.adam_epsilon,
            )
            return self.optimizer
        return super().create_optimizer(model)

    # ---- 7. a stop inside a step ---------------------------------------------------------------------
    def _set_activity(self, what: str, **extra) -> None:
        self.activity = {"what": what, "stage_step": self.state.global_step + 1, **extra}
        if self.on_activity is not None:
            try:
                self.on_activity(dict(self.activity))
            except Exception:  # an observer must never break training
                pass

    def _abort_requested(self) -> bool:
        return self.should_abort is not None and bool(self.should_abort())

    def _check_abort(self) -> None:
        if self._abort_requested():
            raise StepAborted(self.activity)

    def training_step(self, model, inputs, num_items_in_batch):
        accum = self.args.gradient_accumulation_steps
        micro = self._step % accum
        if micro == 0:
            if self._abort_requested():  # nothing of this step has run yet
                raise StepAborted({"what": "between steps", "stage_step": self.state.global_step + 1})
            self._set_activity("sampling")
        else:
            self._set_activity("micro-batch", micro=micro + 1, micro_total=accum)
            self._check_abort()
        with lm_head.keep_logits(KEPT_LOGITS_BYTES if self.opts.keep_lm_head_logits else 0):  # 3. per micro-batch
            out = super().training_step(model, inputs, num_items_in_batch)
        if self.opts.trim_heap:
            trim_heap()  # activations of this micro-batch were just freed
        return out

    # ---- 1. generation ------------------------------------------------------------------------
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if not self.opts.fast_generation or images is not None or multimodal_fields or self.use_vllm:
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        model = self.accelerator.unwrap_model(self.model)
        params = SamplingParams(
            max_new_tokens=self.max_completion_length,
            temperature=self.temperature,
            top_p=self.top_p if self.top_p is not None else 1.0,
            top_k=self.opts.top_k,
            stop_at_answer=self.opts.stop_at_answer,
            force_answer_line=self.opts.force_answer_line,
            force_answer_line_run_on=self.opts.force_answer_line_run_on,
            packed_weights=self.opts.packed_sampling,
            # each process samples its own prompts with its own stream
            seed=self.args.seed * 1_000_003 + self.state.global_step + 7919 * self.accelerator.process_index,
        )
        with lora_merged(model, self.opts.merge_lora):
            out = generate_completions(
                model,
                self._tokenizer,
                prompt_ids,
                params,
                eos_token_ids=list(self.eos_token_ids),
                should_stop=self._abort_requested if self.should_abort is not None else None,
            )
        self._check_abort()  # sampling was cut short (or a stop came just after it): abandon the step
        self._set_activity("scoring")
        mode = "train" if self.model.training else "eval"
        n = len(out.completion_ids)
        self._metrics[mode]["gen/seconds"].append(out.seconds)
        self._metrics[mode]["gen/tokens_per_second"].append(out.generated_tokens / max(out.seconds, 1e-9))
        self._metrics[mode]["gen/completions"].append(n)
        self._metrics[mode]["gen/stopped_at_answer"].append(out.stop_reasons.count("answer") / n)
        self._metrics[mode]["gen/truncated_ratio"].append(out.stop_reasons.count("length") / n)
        forced = out.extra.get("forced_at") or {}
        self._forced_at = [list(forced.get(i, ())) for i in range(n)]
        self._forced_chars = [self._forced_span(out.completion_ids[i], pos) if pos else None
                              for i, pos in enumerate(self._forced_at)]
        if self.opts.force_answer_line > 0:
            self._metrics[mode]["gen/forced_answer_line"].append(len(out.extra.get("forced_rows", ())) / n)
            self._metrics[mode]["gen/forced_tokens"].append(float(out.extra.get("forced_tokens", 0)))
        self.gen_totals["seconds"] += out.seconds
        self.gen_totals["tokens"] += out.generated_tokens
        self.gen_totals["completions"] += n
        if self.opts.trim_heap:
            trim_heap()  # the KV cache was just freed
        # 1. the sampled end token goes back at the end of its completion (TRL keeps it: it is trained on)
        ids = out.trained_ids()
        for p, c in zip(prompt_ids, ids):
            if c:
                self.recent_samples.append((list(p), list(c)))
        return ids, None

    def _forced_span(self, ids: list[int], positions: list[int]) -> list[int]:
        """8. Where the forced tokens stand in the completion's text (as TRL decodes it): [start, end)."""
        dec = self._tokenizer.decode
        return [len(dec(ids[: positions[0]], skip_special_tokens=True)),
                len(dec(ids[: positions[-1] + 1], skip_special_tokens=True))]

    def _generate(self, prompts):
        """8. With force_answer_line_loss = "mask", the forced tokens get 0 in TRL's `tool_mask` (the mask TRL
        keeps tool output out of the loss with); everything else is TRL's."""
        self._forced_at = []
        out = super()._generate(prompts)
        if self.opts.force_answer_line_loss != "mask" or not any(self._forced_at):
            return out
        prompt_ids, completion_ids, tool_mask, *rest = out
        if len(self._forced_at) != len(completion_ids):  # (not our sampler's rows: nothing to mask)
            return out
        tool_mask = [list(m) for m in tool_mask] if tool_mask is not None else [[1] * len(c) for c in completion_ids]
        for row, positions in enumerate(self._forced_at):
            for i in positions:
                tool_mask[row][i] = 0
        return (prompt_ids, completion_ids, tool_mask, *rest)

    # ---- 2. micro-batches keep whole groups ------------------------------------------------------
    def _prepare_inputs(self, generation_batch):
        from trl.trainer.utils import split_tensor_dict

        if not self.model.training:
            return self._generate_and_score_completions(generation_batch)
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            batch = self._generate_and_score_completions(generation_batch)
            self._check_abort()  # before the first micro-batch's forward/backward
            self._emit_groups(generation_batch)
            self._buffered_inputs = split_tensor_dict(batch, self.args.steps_per_generation)
            self._set_activity("micro-batch", micro=1, micro_total=self.args.gradient_accumulation_steps)
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def _emit_groups(self, generation_batch):
        """Hand the observer every group of this step: prompt, G completions, rewards, advantages."""
        if self.on_group is None or not self._logs["prompt"]:
            return
        g = self.num_generations
        n = len(generation_batch)
        # TRL's logs hold the whole generation batch of every process, in process order: take this one's part.
        lo = n * (self.accelerator.num_processes - self.accelerator.process_index)

        def mine(seq):
            seq = list(seq)
            return seq[len(seq) - lo : len(seq) - lo + n]

        prompts = mine(self._logs["prompt"])
        comps = mine(self._logs["completion"])
        rewards = {name: mine(v) for name, v in self._logs["rewards"].items()}
        adv = mine(self._logs["advantages"])
        weights = dict(zip(self.reward_func_names, self.reward_weights.tolist()))

        def text(x):
            if isinstance(x, list) and x and isinstance(x[-1], dict):
                return str(x[-1].get("content", ""))
            return str(x)

        def num(v):
            return 0.0 if v != v else float(v)  # NaN (reward not applicable) counts as 0

        groups = []
        for s in range(0, n - g + 1, g):
            rows = range(s, s + g)
            totals = [sum(weights[k] * num(rewards[k][i]) for k in rewards) for i in rows]
            mean = sum(totals) / g
            std = (sum((t - mean) ** 2 for t in totals) / max(g - 1, 1)) ** 0.5
            msgs = prompts[s] if isinstance(prompts[s], list) else []
            groups.append(
                {
                    "question": str(generation_batch[s].get("question", text(prompts[s]))),
                    "problem_id": str(generation_batch[s].get("problem_id", "")),
                    "answer": str(generation_batch[s].get("answer", "")),
                    "difficulty": generation_batch[s].get("difficulty"),
                    "system": next((m.get("content", "") for m in msgs if m.get("role") == "system"), ""),
                    "completions": [text(comps[i]) for i in rows],
                    "rewards": {k: [num(rewards[k][i]) for i in rows] for k in rewards},
                    "totals": totals,
                    "mean": mean,
                    "std": std,
                    "advantages": [float(adv[i]) for i in rows],
                    # 8. per completion: None, or [start, end) of the "\n####" the trainer wrote in its text
                    "forced": [self._forced_chars[i] if i < len(self._forced_chars) else None for i in rows],
                }
            )
        try:
            self.on_group(
                {
                    "stage_step": self.state.global_step + 1,
                    "weights": weights,
                    "scale_rewards": self.scale_rewards,  # for advantages.what_if: how the advantages were scaled
                    "forced_loss": self.opts.force_answer_line_loss if self.opts.force_answer_line > 0 else None,
                    "groups": groups,
                }
            )
        except Exception:  # an observer must never break training
            pass

    # ---- 3. log-probs with a shared prompt prefix, LM head on completion positions only -------------
    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **kwargs,
    ):
        multimodal = any(v is not None for v in kwargs.values())
        if (
            not self.opts.share_prompt_prefix
            or _checkpointing(model, self.accelerator)  # checkpointed layers drop the prompt's KV cache
            or multimodal
            or compute_aux_loss
            or input_ids.size(1) - logits_to_keep < 2
        ):
            return super()._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size=batch_size,
                compute_entropy=compute_entropy,
                compute_aux_loss=compute_aux_loss,
                **kwargs,
            )
        batch_size = batch_size or input_ids.size(0)
        logps, ents = [], []
        for start in range(0, input_ids.size(0), batch_size):
            sl = slice(start, start + batch_size)
            lp, ent = self._shared_prefix_logps(
                model, input_ids[sl], attention_mask[sl], logits_to_keep, compute_entropy
            )
            logps.append(lp)
            ents.append(ent)
        return torch.cat(logps), (torch.cat(ents) if compute_entropy else None), None

    def _shared_prefix_logps(self, model, input_ids, attention_mask, logits_to_keep, compute_entropy):
        cut = input_ids.size(1) - logits_to_keep - 1  # shared prefix: the prompt but its last token
        key = torch.cat([input_ids[:, :cut], attention_mask[:, :cut]], dim=1)
        uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
        lm = _unwrap_peft(self.accelerator.unwrap_model(model))
        backbone = getattr(lm, lm.base_model_prefix)
        # Replay-safe cache layers: with layer recompute (lean.layer_hooks) every layer runs a second
        # time in backward and calls `update` again; these give the same keys both times.
        cache = _layer_cache([PromptRecordLayer() for _ in range(_num_layers(lm))])
        prompt_pass = {
            "input_ids": uniq[:, :cut],
            "attention_mask": uniq[:, cut:],
            "past_key_values": cache,
            "use_cache": True,
        }
        with self.accelerator.autocast():
            if torch.is_grad_enabled() and self.accelerator.num_processes == 1:
                # The prompt pass runs on aliases of the trainable weights (see _grad_aliases).
                torch.func.functional_call(backbone, _grad_aliases(backbone), kwargs=prompt_pass, strict=False)
            else:
                backbone(**prompt_pass)
        suffix = input_ids[:, cut:]  # last prompt token + completion
        suffix_mask = attention_mask[:, cut:]
        labels = suffix.masked_fill(suffix_mask == 0, -100)
        labels[:, 0] = -100
        # Right-padded: a row's real length is one past its last unmasked position.
        positions = torch.arange(1, suffix.size(1) + 1, device=suffix.device)
        lengths = (suffix_mask * positions).amax(dim=1).clamp(min=2).tolist()
        if self.opts.bucket_lengths and self.accelerator.num_processes == 1:
            buckets = length_buckets(lengths, self.opts.bucket_overhead)
        else:
            buckets = [list(range(suffix.size(0)))]
        width = suffix.size(1)
        logps, ents = [], []
        for i, rows in enumerate(buckets):
            w = max(lengths[r] for r in rows) if self.opts.bucket_lengths else width
            idx = torch.tensor(rows, device=suffix.device)
            pre = inverse.index_select(0, idx)
            call = {
                "input_ids": suffix.index_select(0, idx)[:, :w],
                "attention_mask": attention_mask.index_select(0, idx)[:, : cut + w],
                "past_key_values": _layer_cache([PrefixLayer(la.keys, la.values, pre) for la in cache.layers]),
                "labels": labels.index_select(0, idx)[:, :w],
                "fused_lm_head": True,
            }
            with self.accelerator.autocast():
                if i < len(buckets) - 1 and torch.is_grad_enabled():
                    # Every bucket uses every weight: on aliases, each bucket's weight gradients are folded
                    # in as backward produces them instead of waiting for the last bucket (_grad_aliases).
                    unwrapped = self.accelerator.unwrap_model(model)
                    out = torch.func.functional_call(unwrapped, _grad_aliases(unwrapped), kwargs=call, strict=False)
                else:
                    out = model(**call)
            logps.append(torch.nn.functional.pad(out.log_probs, (0, width - w)))
            if compute_entropy:
                ents.append(torch.nn.functional.pad(out.entropy, (0, width - w)))
        back = torch.argsort(torch.tensor([r for rows in buckets for r in rows], device=suffix.device))
        return torch.cat(logps).index_select(0, back), (torch.cat(ents).index_select(0, back) if compute_entropy else None)

    # ---- 4, 5 and 10. loss ---------------------------------------------------------------------------
    def _generate_and_score_completions(self, inputs):
        """4. A group whose answers all earned the same total gets advantages of exactly 0. 10. Each row's KL
        coefficient, from the problem it was sampled for (`inputs` holds one row per completion)."""
        out = super()._generate_and_score_completions(inputs)
        self._zero_equal_groups(out, len(inputs))
        if self.kl_rows is not None and out.get("ref_per_token_logps") is not None:
            ids, own, rep = self.kl_rows["ids"], self.kl_rows["own"], self.kl_rows["replayed"]
            betas = [rep if str(x.get("problem_id", "")) in ids else own for x in inputs]
            out["kl_beta"] = torch.tensor(betas, dtype=torch.float32, device=out["advantages"].device)
        return out

    def _zero_equal_groups(self, out: dict, n: int) -> None:
        """4. Advantages of exactly 0 for the groups whose G answers all earned the same total reward.

        TRL's float32 group mean of G equal totals can miss them in the last bit (0.3 + 0.1, or 1.9: not
        binary fractions), its std is then ~1e-8 instead of 0, and (total - mean) / (std + 1e-4) gives every
        answer an advantage of about +-1e-3 (an all-right group of the classroom weights: +0.0012) instead of 0.
        The group still teaches nothing, but its rows were trained on, so the skip of 4 did not apply, and TRL's
        `frac_reward_zero_std` (isclose(std, 0)) did not count it. The totals are recomputed here in float64
        from the per-function rewards TRL logged (the same weights, NaN = not applicable = 0, as TRL's nansum):
        a group whose totals are equal to 1e-9 has its advantages, and their logged copies, set to 0, and the
        step's `frac_reward_zero_std` is replaced by that share. Single process only (TRL's logs hold every
        process's rows; a group's rows may span processes)."""
        g, adv = self.num_generations, out.get("advantages")
        names = list(getattr(self, "reward_func_names", []))
        if (self.accelerator.num_processes != 1 or adv is None or adv.dim() != 1 or adv.numel() != n or not names
                or n % g or any(len(self._logs["rewards"][k]) < n for k in names)
                or len(self._logs["advantages"]) < n):
            return
        flat = equal_groups({k: list(self._logs["rewards"][k])[-n:] for k in names},
                            dict(zip(names, self.reward_weights.tolist())), g)
        rows = [s + j for k, s in enumerate(range(0, n, g)) if flat[k] for j in range(g)]
        if rows:
            adv[torch.tensor(rows, device=adv.device)] = 0.0
            logged, first = self._logs["advantages"], len(self._logs["advantages"]) - n
            for r in rows:
                logged[first + r] = 0.0
        mode = "train" if self.model.training else "eval"
        shares = self._metrics[mode].get("frac_reward_zero_std")
        if shares:
            shares[-1] = sum(flat) / len(flat)

    @staticmethod
    def _rows(inputs: dict, idx: torch.Tensor) -> dict:
        n = inputs["advantages"].size(0)
        if idx.numel() == n:  # (every row: a step without replayed problems has one coefficient)
            return inputs
        return {key: (v.index_select(0, idx) if torch.is_tensor(v) and v.dim() > 0 and v.size(0) == n else v)
                for key, v in inputs.items()}

    def _share(self, inputs: dict, idx: torch.Tensor):
        """What TRL's loss over `idx`'s rows alone must be multiplied by to be their part of the loss over all rows
        (dapo's normalizer already counts the whole generation batch)."""
        n, k = inputs["advantages"].size(0), idx.numel()
        if k == n:
            return 1.0
        if self.loss_type in ("grpo", "dr_grpo"):
            return k / n
        if self.loss_type == "bnpo":
            m = inputs["completion_mask"]
            if "tool_mask" in inputs:  # (8, mask: TRL's normalizer counts the tokens in the loss)
                m = m * inputs["tool_mask"]
            return m.index_select(0, idx).sum() / m.sum().clamp(min=1)
        return 1.0

    def _rows_loss(self, model, inputs):
        """4. TRL's loss, skipping the rows whose advantage is 0 where that changes nothing."""
        mode = "train" if self.model.training else "eval"
        can_skip = (
            self.opts.skip_zero_advantage
            and mode == "train"
            and self.beta == 0.0
            and not getattr(self, "_entropy_bonus_enabled", False)
            and self.loss_type in ("dapo", "grpo", "dr_grpo", "bnpo")
            and inputs["advantages"].dim() == 1
            # TRL gathers per-row tensors across processes, which needs the same rows on each, and DDP needs
            # every parameter in each backward: with several processes every row is computed.
            and self.accelerator.num_processes == 1
        )
        if can_skip:
            adv = inputs["advantages"]
            keep = adv != 0
            n, k = adv.numel(), int(keep.sum())
            self._metrics[mode]["skipped_zero_advantage"].append((n - k) / max(n, 1))
            if k == 0:
                first = next(p for p in model.parameters() if p.requires_grad)
                return first.sum() * 0.0
            if k < n:
                idx = keep.nonzero(as_tuple=True)[0]
                return super()._compute_loss(model, self._rows(inputs, idx)) * self._share(inputs, idx)
        return super()._compute_loss(model, inputs)

    def _compute_loss(self, model, inputs):
        mode = "train" if self.model.training else "eval"
        betas = inputs.get("kl_beta")
        if betas is None:
            loss = self._rows_loss(model, inputs)
        else:  # 10. one part per KL coefficient
            loss, beta = None, self.beta
            try:
                for value in sorted(set(betas.tolist())):
                    idx = (betas == value).nonzero(as_tuple=True)[0]
                    self.beta = value
                    part = self._rows_loss(model, self._rows(inputs, idx)) * self._share(inputs, idx)
                    loss = part if loss is None else loss + part
            finally:
                self.beta = beta
        if self.ewc is not None and self.ewc.active and mode == "train" and self._ewc_step != self.state.global_step:
            # Parameters do not change inside an accumulation window: add the term (and its gradient) once.
            self._ewc_step = self.state.global_step
            t0 = time.perf_counter()
            pen = self.ewc.penalty(self.accelerator.unwrap_model(model))
            if not self.ewc_clip_penalty:
                pen = pen.detach()  # value only: the gradient is added after clipping (_ewc_grad_hook)
            loss = loss + pen
            self._metrics[mode]["ewc_penalty"].append(float(pen.detach()))
            self._metrics[mode]["ewc_seconds"].append(time.perf_counter() - t0)
        return loss

    # ---- 6. atomic checkpoints --------------------------------------------------------------------
    def _get_output_dir(self, trial):
        return self._staging_dir or super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial):
        final_root = Path(super()._get_output_dir(trial))
        name = f"checkpoint-{self.state.global_step}"
        staging = final_root / ".staging"
        main = self.accelerator.is_main_process
        if main:
            if staging.exists():
                shutil.rmtree(staging)
            staging.mkdir(parents=True)
        self.accelerator.wait_for_everyone()  # (every process writes its RNG state into the staging folder)
        self._staging_dir = str(staging)
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._staging_dir = None
        self.accelerator.wait_for_everyone()
        if main:  # rank 0 publishes the checkpoint
            folder = staging / name
            if self.checkpoint_hook is not None:
                self.checkpoint_hook(folder, self)
            (folder / "COMPLETE").write_text(str(time.time()))
            publish_dir(folder, final_root / name)
            shutil.rmtree(staging, ignore_errors=True)
        self.accelerator.wait_for_everyone()
