"""The one prompt builder: training rows, the Fisher's samples, evaluation, Try and the benches use it.

A prompt is the chat `[system, user]` (no system message when `system_prompt` is empty) rendered by the
tokenizer's own chat template with the generation prompt added. The user turn is the question followed by
`after_question`: empty by default; training passes `data.training_hint` (e.g. a reminder of the answer
format, which a 135M model follows more often beside the question than in the system message), while a
run's comparisons, Try and exports ask the plain question (docs/experiments.md).
"""

from __future__ import annotations


def build_messages(question: str, system_prompt: str, after_question: str = "") -> list[dict]:
    msgs = []
    if system_prompt:
        msgs.append({"role": "system", "content": system_prompt})
    msgs.append({"role": "user", "content": question + after_question})
    return msgs


def prompt_ids(tokenizer, question: str, system_prompt: str, after_question: str = "") -> list[int]:
    """Token ids of the chat prompt for `question`, ready for the model to answer."""
    ids = tokenizer.apply_chat_template(
        build_messages(question, system_prompt, after_question), add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
