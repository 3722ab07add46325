"""CPU GRPO Studio: GRPO training of small language models on grade-school math, on a CPU.

Engine modules (no UI imports): config, data, rewards, models, generation, ewc, trainer, engine,
runs, evaluation, charts. The Gradio UI lives in `grpo_app.ui` and imports the engine.
"""

__version__ = "0.1.0"
