"""CPU GRPO Studio: GRPO training of small language models on grade-school math, on a CPU.

The layers, each importing only from the ones before it (docs/architecture.md draws them):
`core` (settings, data, answers, rewards, models, files, a run's folder) → `training` (engine, trainer,
sampler, EWC) → `evaluation` (scoring, the stage × task matrix, asking two models) → `runs` (a server's
job, its child process and live view, the scoring queue) and `export` → `cli` and `ui` (the Gradio app).
"""

__version__ = "0.1.0"
