"""The training job: curriculum stages of GRPO, a Fisher at each stage end, EWC in later stages.

`train(cfg, run, reporter, resume)` is what the run manager (and so the CLI and the web app) calls. It
reports through a small interface (`event`, `metrics`, `step`, `status`, `should_stop`), never imports the
UI or the manager, and ends with the trained model saved in the run folder: the evaluation that follows is
the manager's.

Per stage: draw the stage's problems, build a `CurriculumGRPOTrainer` (a fresh AdamW each stage, or with
`carry_moments` one that starts from the previous stage's moments: trainer.py, departure 11),
train `stage.steps` optimizer steps, then (if a later stage follows and EWC is on) estimate the
diagonal Fisher on the stage's prompts and consolidate it with the anchor weights.

Stop requests. In a single process a stop takes effect inside a step (trainer.py, departure 7): between
decode steps of the sampling, and before each micro-batch's forward/backward. That step is abandoned,
never counted; the run keeps the checkpoint of its last complete step (written at that moment if the
save schedule had not written it: the optimizer had not stepped, so the weights, the optimizer moments
and the schedule are exactly that step's, and the random-number states are put back to those of the
step's start). A stop asked during a Fisher pass abandons that pass (the end-of-stage checkpoint stays;
Resume redoes the Fisher). With several processes a stop is decided together at the next step end
(`distributed.any_true` is collective), with a checkpoint of that step. What a stop is waiting for is
reported through the optional `reporter.activity(text)`.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import random
import time
from dataclasses import asdict
from pathlib import Path

import psutil
import torch
from transformers import TrainerCallback

from grpo_app.core import distributed
from grpo_app.core.config import Config
from grpo_app.core.custom_rewards import reward_functions
from grpo_app.core.data import stage_pool, to_rows, with_replay
from grpo_app.core.fileio import atomic_write_json, staged_dir
from grpo_app.core.models import apply_lora, count_parameters, freeze_embeddings, freeze_lower_layers, load_model
from grpo_app.core.prompts import prompt_ids
from grpo_app.core.rewards import build_rewards
from grpo_app.core.run_folder import RunDir
from grpo_app.core.system import cpu_kernels, cpu_name
from grpo_app.training.ewc import EWCState, compute_fisher
from grpo_app.training.lean import layer_hooks, make_lean
from grpo_app.training.optim import held_heap
from grpo_app.training.sampler import SamplingParams, generate_completions, use_fast_attention
from grpo_app.training.settings import grpo_args, kl_rows, trackers, trainer_settings
from grpo_app.training.trainer import CurriculumGRPOTrainer, StepAborted, restore_forward


class Reporter:
    """What the engine tells the outside world (the run folder, the live store, a bench): every method a
    no-op here; `manager._JobReporter` writes them down, a bench may keep them (bench/step_speed.py)."""

    def event(self, kind, **data):
        pass

    def metrics(self, rec):
        pass

    def step(self, snapshot):
        pass

    def status(self, **fields):
        pass

    def should_stop(self):
        return False

    def activity(self, text):
        pass


class Observer:
    """A supported hook into training for benches and tools (`train(..., observers=[...])`): each method is
    called in the training thread at the moment its name says, with the live model where it has one; every
    method here does nothing. An observer only looks (it must not change the weights); a stop is asked
    through the reporter's `should_stop`, as the app asks it. A run never pays for a hook it was not given.

    * `step_end(model, step, stage)`: an optimizer step ended (`step`: steps done in the run, 1 = first).
    * `fisher_begin(stage)` / `fisher_end(stage)`: the Fisher pass after stage `stage` (0-based).
    * `stage_end(model, stage)`: stage `stage` ended, before its Fisher pass.
    * `before_final_save(model)`: training is complete; the final model is about to be written.
    """

    def step_end(self, model, step: int, stage: int) -> None:
        pass

    def fisher_begin(self, stage: int) -> None:
        pass

    def fisher_end(self, stage: int) -> None:
        pass

    def stage_end(self, model, stage: int) -> None:
        pass

    def before_final_save(self, model) -> None:
        pass


def _activity(reporter, text: str) -> None:
    """Tell the reporter what the job is doing now, i.e. what a stop asked now would wait for."""
    fn = getattr(reporter, "activity", None)
    if fn is not None:
        fn(text)


def step_activity(act: dict, offset: int, in_step: bool) -> str:
    """What a stop asked now waits for, from the trainer's activity record (stage step -> run step)."""
    n = offset + int(act.get("stage_step") or 1)
    kept = f"step {n} is dropped and step {n - 1} is kept" if n > 1 else "no step is complete yet"
    what = act.get("what")
    last_micro = what == "micro-batch" and act.get("micro") == act.get("micro_total")
    if not in_step or what == "update" or last_micro:
        return f"finishing step {n} and saving its checkpoint"
    if what == "sampling":
        return f"ending the sampling of step {n} ({kept})"
    if what == "scoring":
        return f"ending the scoring of step {n}'s completions ({kept})"
    if what == "micro-batch":
        return f"finishing micro-batch {act.get('micro')}/{act.get('micro_total')} of step {n} ({kept})"
    return f"reaching a safe point in step {n}"


def _tracker_setup(cfg: Config, run: RunDir) -> None:
    """Trackers write inside the run folder and never need the network: wandb in offline mode (unless
    WANDB_MODE says otherwise) under <run>/wandb, trackio's local database under <run>/trackio (trackio
    reads TRACKIO_DIR when first imported). TensorBoard's folder is set per stage in run_stage."""
    names = trackers(cfg)
    if "wandb" in names:
        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ["WANDB_DIR"] = str(run.path)
        os.environ.setdefault("WANDB_PROJECT", "grpo-app")
    if "trackio" in names:
        os.environ["TRACKIO_DIR"] = str(run.path / "trackio")


def tensorboard_dir(run: RunDir, stage_index: int) -> Path:
    return run.path / "tensorboard" / f"stage-{stage_index + 1}"


class _EngineCallback(TrainerCallback):
    """Turns TRL's logs into metric records, honours stop requests, times steps."""

    def __init__(self, cfg: Config, stage_index: int, offset: int, reporter, run_start: float, trainer_ref,
                 observers=()):
        self.cfg, self.k, self.offset, self.reporter = cfg, stage_index, offset, reporter
        self.observers = tuple(observers)
        self.run_start = run_start
        self.trainer_ref = trainer_ref
        self.last_time = None
        self.last_gen = {"seconds": 0.0, "tokens": 0, "completions": 0}
        self.stopped = False
        self.proc = psutil.Process()
        self.rng_at_step_begin = None

    def on_train_begin(self, args, state, control, **kw):
        self.last_time = time.time()

    def on_step_begin(self, args, state, control, **kw):
        self.rng_at_step_begin = _rng_states()  # what an abandoned step's checkpoint puts back (a few KB)

    def on_pre_optimizer_step(self, args, state, control, **kw):
        tr = self.trainer_ref()
        if tr is not None:
            tr._set_activity("update")

    def on_step_end(self, args, state, control, **kw):
        if self.observers:
            tr = self.trainer_ref()
            for ob in self.observers:
                ob.step_end(tr.model if tr is not None else kw.get("model"), self.offset + state.global_step, self.k)
        if state.global_step >= args.max_steps:
            control.should_save = True  # every stage ends with a checkpoint (resume and the Fisher rely on it)
        if distributed.any_true(self.reporter.should_stop()):  # every process stops at the same step
            self.stopped = True
            control.should_training_stop = True
            control.should_save = True

    def on_log(self, args, state, control, logs=None, **kw):
        logs = logs or {}
        if "reward" not in logs:
            return
        now = time.time()
        step_s = now - (self.last_time or now)
        self.last_time = now
        tr = self.trainer_ref()
        gen = dict(tr.gen_totals) if tr is not None else self.last_gen
        d_tok = gen["tokens"] - self.last_gen["tokens"]
        d_comp = gen["completions"] - self.last_gen["completions"]
        d_gen_s = gen["seconds"] - self.last_gen["seconds"]
        self.last_gen = gen
        stage = self.cfg.stages[self.k]
        rewards = {
            key.split("/")[1]: v for key, v in logs.items() if key.startswith("rewards/") and key.endswith("/mean")
        }
        steps_done = self.offset + state.global_step
        rec = {
            "step": steps_done,
            "stage": self.k,
            "stage_name": stage.name,
            "stage_step": state.global_step,
            "time": now,
            "elapsed": now - self.run_start,
            "reward": logs.get("reward"),
            "reward_std": logs.get("reward_std"),
            "rewards": rewards,
            "frac_zero_std": logs.get("frac_reward_zero_std"),
            "loss": logs.get("loss"),
            "kl": logs.get("kl"),
            "ewc_penalty": logs.get("ewc_penalty", 0.0),
            "ewc_seconds": logs.get("ewc_seconds"),
            "entropy": logs.get("entropy"),
            "completion_length": logs.get("completions/mean_length"),
            "truncated_ratio": logs.get("gen/truncated_ratio", logs.get("completions/clipped_ratio")),
            "stopped_at_answer": logs.get("gen/stopped_at_answer"),
            "forced_answer_line": logs.get("gen/forced_answer_line"),
            "skipped_zero_adv": logs.get("skipped_zero_advantage"),
            "grad_norm": logs.get("grad_norm"),
            "lr": logs.get("learning_rate"),
            "step_seconds": step_s,
            "gen_seconds": d_gen_s,
            "tokens_per_s": d_tok / step_s if step_s > 0 else None,
            "gen_tokens_per_s": d_tok / d_gen_s if d_gen_s > 0 else None,
            "completions_per_s": d_comp / step_s if step_s > 0 else None,
            "rss_mb": self.proc.memory_info().rss / 2**20,
        }
        self.reporter.metrics(rec)
        self.reporter.status(stage=self.k, stage_name=stage.name, step=steps_done, stage_step=state.global_step)


def _rng_states() -> dict:
    import numpy as np

    out = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.random.get_rng_state_all()
    return out


def _set_rng_states(states: dict) -> None:
    import numpy as np

    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.random.set_rng_state(states["cpu"])
    if "cuda" in states:
        torch.cuda.random.set_rng_state_all(states["cuda"])


def _training_prompt(tokenizer, question: str, data_cfg) -> list[int]:
    """A training prompt: the system prompt, the question and data.training_hint (which only training uses)."""
    return prompt_ids(tokenizer, question, data_cfg.system_prompt, data_cfg.training_hint)


def _reference_samples(tokenizer, problems, data_cfg, n: int, seed: int):
    rng = random.Random(seed)
    picks = rng.sample(problems, min(n, len(problems)))
    out = []
    for p in picks:
        prompt = _training_prompt(tokenizer, p.question, data_cfg)
        completion = tokenizer(p.solution, add_special_tokens=False)["input_ids"]
        out.append((prompt, completion))
    return out


def _fresh_samples(model, tokenizer, problems, cfg: Config, n: int, seed: int):
    """Sample the policy once per prompt (used when a resumed run has no recent samples)."""
    rng = random.Random(seed)
    picks = rng.sample(problems, min(n, len(problems)))
    prompts = [_training_prompt(tokenizer, p.question, cfg.data) for p in picks]
    params = SamplingParams(
        max_new_tokens=cfg.grpo.max_completion_length,
        temperature=cfg.grpo.temperature,
        top_p=cfg.grpo.top_p,
        top_k=cfg.grpo.top_k,
        stop_at_answer=cfg.grpo.stop_at_answer,
        seed=seed,
        packed_weights=cfg.grpo.packed_sampling,
    )
    out = generate_completions(model, tokenizer, prompts, params)
    return [(p, c) for p, c in zip(prompts, out.trained_ids()) if c]  # as training saw them (end token kept)


def prepare_model(cfg: Config, device: str = "auto"):
    model, tok, spec = load_model(
        cfg.model.name, dtype=cfg.model.dtype, device=cfg.model.device, threads=cfg.model.threads, seed=cfg.run.seed
    )
    if cfg.model.lora:
        model = apply_lora(model, cfg.model)
    elif not cfg.model.train_embeddings:
        freeze_embeddings(model)
    freeze_lower_layers(model, cfg.model.trainable_layers)
    if cfg.grpo.lean_activations:
        make_lean(model)
    layer_hooks(model, recompute=cfg.grpo.gradient_checkpointing)
    use_fast_attention(model)
    model.train()
    return model, tok, spec


def save_final(model, tokenizer, run: RunDir, info: dict) -> Path:
    """Save a from_pretrained-loadable model into run/final (LoRA merged), atomically."""
    to_save = model
    try:
        from peft import PeftModel

        if isinstance(model, PeftModel):
            import copy

            to_save = copy.deepcopy(model).merge_and_unload()
    except ImportError:  # pragma: no cover
        pass
    restore_forward(to_save)
    to_save.config._attn_implementation = "sdpa"
    with staged_dir(run.final_dir) as tmp:
        to_save.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "grpo_app.json").write_text(json.dumps(info, indent=1))
    if hasattr(model, "set_attn_implementation"):
        use_fast_attention(model)
    return run.final_dir


def save_stage_end(model, run: RunDir, k: int) -> Path:
    """The trainable weights as stage k ended (float32), for the stage x task matrix of a run without EWC."""
    return write_stage_end({n: p.detach() for n, p in model.named_parameters() if p.requires_grad}, run, k)


def write_stage_end(weights: dict, run: RunDir, k: int) -> Path:
    """Keep `weights` (name -> tensor) as stage k's end, float32, where the matrix reads a run without EWC.
    Written under a temporary name and renamed, so a reader never sees half a file."""
    from safetensors.torch import save_file

    path = run.stage_ends_dir / f"stage-{k}.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file({n: t.float().contiguous() for n, t in weights.items()}, str(tmp), metadata={"stage": str(k)})
    os.replace(tmp, path)
    return path


def load_checkpoint_weights(model, folder: Path) -> None:
    """Load the trained weights of a checkpoint folder into `model` (full or LoRA)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    adapter = folder / "adapter_model.safetensors"
    if adapter.is_file():
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(str(adapter)))
        return
    state = load_file(str(folder / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"}
    if unexpected or set(missing) - tied:
        raise RuntimeError(
            f"checkpoint {folder.name} does not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )


def checkpoint_moments(folder: Path, k: int) -> dict:
    """The optimizer state of the checkpoint written when stage k's last step ended (TRL's `optimizer.pt`): the
    moments stage k+1 starts from when it carries them (`carry_moments`)."""
    path = Path(folder) / "optimizer.pt"
    if not path.is_file():
        raise RuntimeError(
            f"stage {k + 2} starts from the optimizer moments stage {k + 1} ended with (carry_moments), and the "
            f"checkpoint at the end of stage {k + 1} holds none; resume with carry_moments off for stage {k + 2}, "
            "or train the run again."
        )
    return torch.load(path, map_location="cpu", weights_only=True)


def _ewc_saved(run: RunDir, k: int) -> bool:
    d = run.ewc_dir / f"stage-{k}"
    return (d / "ewc.json").is_file() and (d / "ewc.safetensors").is_file()


class _Job:
    """One call of `train`: holds the model and the state shared by the stages."""

    def __init__(self, cfg: Config, run: RunDir, reporter, observers=()):
        self.cfg, self.run, self.reporter = cfg, run, reporter
        self.observers = tuple(observers)
        self.t_start = time.time()
        self.model = self.tok = self.spec = None
        self.device: torch.device | None = None  # the model's, once loaded
        self.ewc: EWCState | None = None
        self.moments: dict | None = None  # the last stage's optimizer state, kept while the next one carries it
        # every reward some stage weights (a stage may give weight to one the run leaves at 0)
        used = {n: 1.0 for n, w in cfg.rewards.weights.items()
                if float(w) != 0.0 or any(float(st.reward_weights.get(n, 0.0)) != 0.0 for st in cfg.stages)}
        self.rewards, _ = build_rewards(used, reward_functions(cfg.rewards))
        self.reward_names = list(used)

    def ewc_offload(self) -> bool:
        """`ewc.offload` saves CPU memory; on a GPU the state stays in the GPU's memory next to the weights
        (reading it from disk and copying it over twice a step would only cost time)."""
        return self.cfg.ewc.offload and self.device.type == "cpu"

    def load_ewc(self, folder: Path) -> EWCState:
        return EWCState.load(folder, lam=self.cfg.ewc.lam, offload=self.ewc_offload(), device=self.device)

    # -- the Fisher at a stage end ----------------------------------------------------------------
    def consolidate(self, k: int, pool, recent: list) -> bool:
        """The Fisher after stage k, consolidated into the EWC state. False: a stop abandoned the pass."""
        cfg = self.cfg
        self.reporter.status(phase=f"Fisher after stage {k + 1}")
        _activity(self.reporter, f"ending the Fisher pass after stage {k + 1} (the end-of-stage checkpoint is kept)")
        n = cfg.ewc.fisher_samples
        note = cfg.ewc.fisher_source
        if cfg.ewc.fisher_source == "reference":
            samples = _reference_samples(self.tok, pool.problems, cfg.data, n, cfg.run.seed + k)
        elif len(recent) >= n:
            samples = random.Random(cfg.run.seed + k).sample(recent, n)
        else:
            samples = _fresh_samples(self.model, self.tok, pool.problems, cfg, n, cfg.run.seed + k)
            note = "sampled (fresh: the run was resumed at this stage end)"
        asked: list = []

        def stop_asked() -> bool:  # single process only: the Fisher's mean is a collective across processes
            if self.reporter.should_stop():
                asked.append(True)
            return bool(asked)

        for ob in self.observers:
            ob.fisher_begin(k)
        try:
            fisher, stats = compute_fisher(
                self.model, samples, should_stop=None if distributed.active() else stop_asked
            )
        except InterruptedError:  # stopped before its first sample
            return False
        finally:
            for ob in self.observers:
                ob.fisher_end(k)
        if asked:  # cut short: a partial Fisher is never used
            del fisher
            gc.collect()
            return False
        folder = self.run.ewc_dir / f"stage-{k}"
        # (with several processes the Fisher is already their mean: rank 0 writes it, the others read it)
        info = {"stage": k, "name": cfg.stages[k].name, "samples": stats.samples}
        if distributed.is_main():
            self.ewc.consolidate(self.model, fisher, info, folder=folder)
        distributed.barrier()
        if not distributed.is_main():
            self.ewc = self.load_ewc(folder)
        del fisher
        self.reporter.event(
            "fisher_done",
            stage=k,
            samples=stats.samples,
            seconds=round(stats.seconds, 2),
            source=note,
            mean=stats.mean,
            max=stats.max,
            top=stats.top,
        )
        gc.collect()
        return True

    # -- the KL reference (grpo.beta > 0) ----------------------------------------------------------
    def reference_model(self, k: int, resuming: bool):
        """A frozen copy of the policy as stage k began: the reference of stage k's KL term (departure 9 in
        trainer.py). Resuming inside stage k, the policy still holds the weights it was loaded with (the
        checkpoint's come in `trainer.train`): the stage-(k-1) end the run kept (EWC anchor or stage_ends/)
        replaces its trainable weights; for stage 1 those loaded weights are the start. None with LoRA: TRL
        then takes the model with its adapters switched off (the base model) as the reference."""
        if self.cfg.model.lora:
            return None
        policy = self.model
        ref = type(policy)(copy.deepcopy(policy.config)).to(dtype=policy.dtype, device=self.device)
        ref.load_state_dict(policy.state_dict())
        if resuming and k > 0:
            weights = self.run.stage_end_state(k - 1)
            if weights is None:
                raise RuntimeError(
                    f"a KL term (beta or replay_beta > 0) needs the weights this run had when stage {k} ended "
                    f"(the KL reference of stage {k + 1}), and the run did not keep them; resume with the stage's "
                    "beta and replay_beta at 0, or train it again."
                )
            unexpected = ref.load_state_dict(weights, strict=False).unexpected_keys
            if unexpected:
                raise RuntimeError(f"the kept end of stage {k} does not fit the model ({unexpected[:3]}).")
        ref.requires_grad_(False)
        ref.eval()
        return ref

    # -- one stage ---------------------------------------------------------------------------------
    def run_stage(self, k: int, offset: int, device: str, resume_from: str | None):
        cfg, run, reporter = self.cfg, self.run, self.reporter
        stage = cfg.stages[k]
        pool = stage_pool(stage, cfg.data, seed=cfg.data.seed + k)
        if self.ewc is not None:
            self.ewc.lam = cfg.stage_ewc_lam(k)
        active_ewc = self.ewc if (self.ewc is not None and self.ewc.active) else None
        args = grpo_args(cfg, k, run.checkpoints_dir / f"stage-{k}", device, run_name=f"{run.id}-stage{k + 1}")
        # (the run's seed too: a replay stage is not shuffled by TRL, whose shuffle follows the run's seed)
        problems = with_replay(cfg.stages, k, cfg.data, cfg.data.seed + 7919 * (k + 1) + 104729 * cfg.run.seed,
                               pool.problems)
        own = {p.id for p in pool.problems}
        replayed = {p.id for p in problems if p.id not in own}
        reporter.event(
            "stage_start",
            stage=k,
            name=stage.name,
            source=pool.source,
            origin=pool.origin,
            problems=len(problems),
            steps=stage.steps,
            ewc=active_ewc is not None,
            device=device,
            precision="bfloat16 autocast" if args.bf16 else "float32",
            **({"replayed": len(replayed)} if stage.replay else {}),
        )
        reporter.status(stage=k, stage_name=stage.name, phase=f"stage {k + 1}/{len(cfg.stages)}: {stage.name}")
        _activity(reporter, f"the set-up of stage {k + 1} (none of its steps has begun)")
        from datasets import Dataset

        dataset = Dataset.from_list(to_rows(problems, cfg.data.system_prompt, cfg.data.training_hint))
        box: dict = {}

        def on_group(snap):
            step = offset + snap["stage_step"]
            try:  # what this step trained on, complete (held-out sets are checked against it; steps.jsonl is thinned)
                run.append_trained(step, k, [(g.get("problem_id", ""), g.get("question", "")) for g in snap["groups"]])
            except OSError:  # a full disk must not stop training here; the check then also reads the pools
                pass
            reporter.step({**snap, "stage": k, "stage_name": stage.name, "step": step})

        def checkpoint_hook(folder: Path, tr):
            atomic_write_json(
                folder / "engine_state.json",
                {
                    "stage_index": k,
                    "stage_step": tr.state.global_step,
                    "global_step": offset + tr.state.global_step,
                    "ewc_stages": len(self.ewc.stages) if self.ewc is not None else 0,
                    "time": time.time(),
                },
            )

        cb = _EngineCallback(cfg, k, offset, reporter, self.t_start, lambda: box.get("t"), self.observers)
        in_step = not distributed.active()  # see the module docstring: in-step stops are single-process
        ref = self.reference_model(k, resume_from is not None) if cfg.stage_has_kl(k) else None
        trainer = CurriculumGRPOTrainer(
            model=self.model,
            processing_class=self.tok,
            reward_funcs=self.rewards,
            args=args,
            train_dataset=dataset,
            callbacks=[cb],
            ewc=active_ewc,
            **trainer_settings(cfg, k, self.reward_names),
            on_group=on_group,
            checkpoint_hook=checkpoint_hook,
            should_abort=reporter.should_stop if in_step else None,
            on_activity=lambda act: _activity(reporter, step_activity(act, offset, in_step)),
            ref_model=ref,
            kl_rows=kl_rows(cfg, k, replayed),
            initial_moments=self.moments,  # (kept only when this stage carries them)
        )
        self.moments = None
        if "tensorboard" in args.report_to:  # one TensorBoard run per stage, inside the run folder
            from transformers.integrations import TensorBoardCallback

            for c in trainer.callback_handler.callbacks:
                if isinstance(c, TensorBoardCallback):
                    c.logging_dir = str(tensorboard_dir(run, k))
        box["t"] = trainer
        stop = None
        try:
            trainer.train(resume_from_checkpoint=resume_from)
            if cb.stopped:
                stop = {}
        except StepAborted as e:
            stop = self.after_abort(trainer, e.where, k, offset, cb)
        if distributed.is_main():
            run.prune_checkpoints(self.cfg.run.keep_checkpoints)
        recent = list(trainer.recent_samples)
        if stop is None and k + 1 < len(cfg.stages) and cfg.stages[k + 1].carry_moments:
            self.moments = trainer.optimizer.state_dict()  # (the tensors themselves: the optimizer goes with the trainer)
        del trainer, box["t"], ref
        restore_forward(self.model)
        gc.collect()
        return pool, recent, stop

    def after_abort(self, trainer, where: dict, k: int, offset: int, cb) -> dict:
        """A stop abandoned a step of stage k: keep (or write) the checkpoint of the last complete step."""
        trainer.model.zero_grad(set_to_none=True)  # the abandoned step's partial gradients
        done = trainer.state.global_step  # complete steps of this stage
        info = {"during": where.get("what")}
        if where.get("what") != "between steps":
            info["abandoned_step"] = offset + int(where.get("stage_step") or done + 1)
        last = self.run.latest_checkpoint()
        if done > 0 and (last is None or last["global_step"] < offset + done):
            # The optimizer has not stepped since step `done` ended: weights, moments and the schedule are that
            # step's. Its checkpoint is written now, with the random-number states of the abandoned step's start.
            self.reporter.status(phase=f"stopping: saving the checkpoint of step {offset + done}")
            _activity(self.reporter, f"saving the checkpoint of step {offset + done}")
            if cb.rng_at_step_begin is not None:
                _set_rng_states(cb.rng_at_step_begin)
            trainer._save_checkpoint(trainer.model, trial=None)
            info["checkpoint_written_at_stop"] = True
        return info


def train(cfg: Config, run: RunDir, reporter=None, resume: bool = False, observers=()) -> str:
    """Run (or resume) the job described by `cfg` in `run`. Returns 'completed' or 'stopped'.
    `observers`: `Observer`s that see each step, stage end, Fisher pass and the final model (benches).
    With `grpo.keep_freed_memory`, the whole job runs inside `optim.held_heap` (freed memory kept, no trims)."""
    with held_heap(cfg.grpo.keep_freed_memory):
        return _train(cfg, run, reporter, resume, observers)


def _train(cfg: Config, run: RunDir, reporter, resume: bool, observers) -> str:
    reporter = reporter or Reporter()
    job = _Job(cfg, run, reporter, observers)
    _tracker_setup(cfg, run)
    torch.manual_seed(cfg.run.seed)
    random.seed(cfg.run.seed)
    n_stages = len(cfg.stages)

    ck = run.latest_checkpoint() if resume else None
    if resume and ck is None:
        raise RuntimeError("no complete checkpoint to resume from")
    reporter.status(status="running", phase="loading model")
    _activity(reporter, "the model to finish loading")
    job.model, job.tok, job.spec = prepare_model(cfg)
    job.device = next(job.model.parameters()).device
    device = job.device.type
    total, trainable = count_parameters(job.model)
    reporter.event(
        "model_loaded",
        model=job.spec.label,
        parameters=total,
        trainable=trainable,
        seconds=round(time.time() - job.t_start, 2),
        device=device,
        threads=torch.get_num_threads(),
        # which CPU, and the instruction set torch's kernels use on it: a run's times depend on both
        cpu=cpu_name(),
        cpu_kernels=cpu_kernels(),
    )
    job.ewc = (
        EWCState(cfg.ewc.lam, cfg.ewc.gamma, cfg.ewc.normalize, offload=job.ewc_offload()) if cfg.ewc.enabled else None
    )

    # Where to start: a checkpoint inside stage k resumes that stage's trainer; a checkpoint at the
    # end of stage k loads its weights, then (re)does the Fisher of stage k if it was not saved.
    k0, resume_from = 0, None
    if ck is not None:
        k0 = ck["stage_index"]
        done = ck["stage_step"] >= cfg.stages[k0].steps
        if job.ewc is not None and k0 > 0:
            job.ewc = job.load_ewc(run.ewc_dir / f"stage-{k0 - 1}")
        dropped = run.truncate_metrics_after(ck["global_step"]) if distributed.is_main() else 0
        reporter.event(
            "resumed",
            stage=k0,
            stage_step=ck["stage_step"],
            step=ck["global_step"],
            checkpoint=Path(ck["path"]).name,
            dropped_metric_lines=dropped,
            **({"skipped": [f"{n}: {why}" for n, why in skipped]} if (skipped := run.damaged_checkpoints()) else {}),
        )
        if done:
            load_checkpoint_weights(job.model, Path(ck["path"]))
            if k0 + 1 < n_stages and cfg.stages[k0 + 1].carry_moments:
                job.moments = checkpoint_moments(Path(ck["path"]), k0)
            if job.ewc is not None and k0 < n_stages - 1:
                if _ewc_saved(run, k0):
                    job.ewc = job.load_ewc(run.ewc_dir / f"stage-{k0}")
                else:
                    pool = stage_pool(cfg.stages[k0], cfg.data, seed=cfg.data.seed + k0)
                    if not job.consolidate(k0, pool, []):
                        reporter.event("stopped", stage=k0, step=ck["global_step"], checkpoint=Path(ck["path"]).name,
                                       during="fisher")
                        return "stopped"
            k0 += 1
        else:
            resume_from = ck["path"]

    offset = sum(s.steps for s in cfg.stages[:k0])
    for k in range(k0, n_stages):
        pool, recent, stop = job.run_stage(k, offset, device, resume_from if k == k0 else None)
        if stop is not None:
            last = run.latest_checkpoint()
            reporter.event(
                "stopped",
                stage=k,
                step=last["global_step"] if last else 0,
                checkpoint=Path(last["path"]).name if last else None,
                **stop,
            )
            return "stopped"
        offset += cfg.stages[k].steps
        reporter.event("stage_end", stage=k, name=cfg.stages[k].name, step=offset)
        for ob in job.observers:
            ob.stage_end(job.model, k)
        if job.ewc is None and k < n_stages - 1 and distributed.is_main():
            save_stage_end(job.model, run, k)  # (with EWC the anchor keeps them; the last stage's are final/)
        if job.ewc is not None and k < n_stages - 1:
            finished = job.consolidate(k, pool, recent)
            if not finished or distributed.any_true(reporter.should_stop()):  # asked during the Fisher pass
                reporter.event(
                    "stopped", stage=k, step=offset, checkpoint="end of stage", **({} if finished else {"during": "fisher"})
                )
                return "stopped"

    if distributed.active():
        reporter.event("replicas_checked", **distributed.check_replicas(job.model))
    reporter.status(phase="saving final model")
    info = {
        "run_id": run.id,
        "preset": cfg.preset,
        "base_model": cfg.model.name,
        "stages": [asdict(s) for s in cfg.stages],
        "trained_seconds": round(time.time() - job.t_start, 1),
    }
    if not distributed.is_main():  # rank 0 saves the model and evaluates it
        distributed.barrier()
        return "completed"
    for ob in job.observers:
        ob.before_final_save(job.model)
    path = save_final(job.model, job.tok, run, info)
    distributed.barrier()
    reporter.event("final_saved", path=str(path.relative_to(run.path)))
    return "completed"
