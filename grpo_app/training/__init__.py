"""Training: one module turns a `Config` into TRL's `GRPOConfig` and the engine's options (`settings`); the
engine runs the curriculum stages (`engine`) on TRL's `GRPOTrainer` subclass (`trainer`), which samples
with the project's own batched sampler (`sampler`), keeps earlier stages with the Fisher penalty (`ewc`),
and uses a lean memory path (`lean`, `optim`). `advantages` recomputes TRL's group advantages for the
What-if panel; `estimate` predicts a step's memory and time before Start.
"""
