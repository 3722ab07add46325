"""Fast batched sampling on CPU for small causal LMs.

Why not `model.generate`: on a 2-core CPU, HF `generate` spends much of each decode step outside the
matrix multiplies — growing the KV cache with `torch.cat` (copying the whole cache every token),
`torch.multinomial` over a 49k vocabulary (its exponential sampler alone took ~84 ms a step at batch
64), and the CPU flash-attention kernel with a single query token. This module keeps the model's own
forward (so any HF causal LM works: Llama, Qwen2, ...) and replaces only what is around it:

* distinct prompts are prefilled once each, in buckets of similar length (little padding);
* the prompt of a GRPO group is prefilled once, and its keys/values are *not* copied to the G rows
  that share it: decode attention reads the prompt's KV once per group ("cascade" attention: the
  prompt part and each row's own completion part are computed separately and merged with their
  log-sum-exps). At batch 64 the KV cache is most of the memory traffic of a decode step;
* the completions' KV is preallocated per layer; each step writes one column and attends to a view;
* single-token decode attention is a grouped batched matmul on the KV heads (no `repeat_kv`);
* sampling is inverse-CDF on the softmax with an explicit `torch.Generator` (reproducible), in two
  levels (blocks of 256 tokens, then within the chosen block) so no cumulative sum runs over the
  whole 49k vocabulary;
* rows that finished (EOS, or a complete final-answer line when `stop_at_answer`) leave the batch;
* with `force_answer_line` (a training option, off by default), a share of the rows that would end without
  a '#### <number>' line get its start, "\n####", in place of their EOS and go on sampling: the policy
  writes the number (with `force_answer_line_run_on` False, not the rows whose answer is already there, run on at the end
  of a line). Those forced tokens were not sampled (see trainer.py, departure 8);
* with `packed_weights`, every float32 `Linear` runs on a copy of its weight that oneDNN packed once per
  call (`packed_linears`): MKL's sgemm re-packs each weight on every product, which at a decode step's
  few rows is most of its cost. The same model up to float rounding (the tests and the bench sample the same
  tokens with and without it), one extra copy of the weights in memory while sampling.

`generate_completions` returns token ids (without EOS), why each row stopped, and the end token a row sampled.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from grpo_app.core.answers import extract_final_answer, has_final_line

ATTN_IMPL = "grpo_cpu"


def _decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Attention for one query token per row, on the KV heads directly.

    query [B, H, 1, D]; key/value [B, KVH, T, D] (views into a preallocated cache are fine);
    attention_mask: None, bool [B, 1, 1, T] (True = attend) or additive float.
    Anything else (prefill, training, gradients) goes to SDPA: `_gqa_sdpa` on CPU, HF's otherwise.
    """
    if query.shape[2] != 1 or torch.is_grad_enabled() or kwargs.get("output_attentions"):
        return _gqa_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    bsz, n_heads, _, dim = query.shape
    n_kv = key.shape[1]
    groups = n_heads // n_kv
    if scaling is None:
        scaling = dim**-0.5
    layer = getattr(key, "_grpo_layer", None)  # set by _SharedPrefixLayer on the views it returns
    if layer is not None:
        return _cascade_attention(query.reshape(bsz, n_kv, groups, dim), key, value, layer, scaling), None
    q = query.reshape(bsz, n_kv, groups, dim)
    scores = torch.matmul(q, key.transpose(-1, -2))  # [B, KVH, G, T]
    scores.mul_(scaling)
    if attention_mask is not None:
        mask = attention_mask[:, :, :, : key.shape[-2]]  # [B, 1, 1, T]
        if mask.dtype == torch.bool:
            scores.masked_fill_(~mask, torch.finfo(scores.dtype).min)
        else:
            scores.add_(mask)
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, value)  # [B, KVH, G, D]
    return out.reshape(bsz, n_heads, 1, dim).transpose(1, 2), None


def _gqa_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """HF's SDPA attention, except that on CPU grouped-query models attend on their KV heads directly.

    HF repeats every KV head for each query head it serves (`repeat_kv`) whenever there is a mask, and
    autograd then keeps the repeated copies for backward: for SmolLM2 (9 query heads, 3 KV heads) that is
    3x the KV bytes in every layer (~260 MB for 8 completions of 97 tokens after a 150-token prompt).
    ATen's CPU kernel takes the KV heads as they are (`enable_gqa=True`) with any mask, and computes the
    same attention. Everything this does not cover goes to HF's function unchanged.
    """
    groups = getattr(module, "num_key_value_groups", 1)
    if (
        query.device.type != "cpu"
        or groups <= 1
        or key.shape[1] * groups != query.shape[1]
        or any(kwargs.get(k) is not None for k in ("softcap", "position_bias", "cache"))
        or kwargs.get("output_attentions")
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    q_len = query.shape[2]
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    is_causal = bool(q_len > 1 and attention_mask is None and is_causal)
    if is_causal and key.shape[2] > q_len:  # as HF: a causal mask without a mask only fits q_len == kv_len
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=is_causal,
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


_CPU_FLASH = True  # tests turn it off to run the portable branch (the one GPUs take) on the CPU


def _partial_attention(q, k, v, scaling, mask=None):
    """Attention of q over (k, v) alone, and its log-sum-exp: (out [.., Q, D], lse [.., Q, 1]).

    On CPU this is ATen's flash-attention kernel (blocked, fused exponentials), which returns the
    log-sum-exp that merging two parts needs; elsewhere the same thing in plain matmuls."""
    if q.device.type == "cpu" and _CPU_FLASH:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=mask, scale=scaling
        )
        return out, lse.unsqueeze(-1)
    # float32 whatever the model runs in (under bf16 autocast q/k/v are bf16 and autocast would make the
    # log-sum-exp float32 but the products bf16); the output comes back in q's dtype.
    with torch.autocast(q.device.type, enabled=False):
        s = torch.matmul(q.float(), k.float().transpose(-1, -2)).mul_(scaling)
        if mask is not None:
            s.add_(mask)
        lse = torch.logsumexp(s, -1, keepdim=True)
        out = torch.matmul(s.sub_(lse).exp_(), v.float())
    return out.to(q.dtype), lse


def _cascade_attention(q, suffix_k, suffix_v, layer: _SharedPrefixLayer, scaling: float) -> torch.Tensor:
    """Decode attention of q [B, KVH, g, D] over a prompt shared by groups of rows (`layer.prefix_k/v`)
    plus each row's own completion KV ([B, KVH, L, D]); returns [B, 1, KVH*g, D]."""
    bsz, n_kv, g, dim = q.shape
    shared = layer.shared
    u, s = shared.n_prompts, shared.slots
    # Prompt part: queries of the rows that share prompt i, attended together against its KV (read once).
    if shared.dense:
        qg = q.view(u, s, n_kv, g, dim)
    else:
        qg = q.new_zeros(u * s, n_kv, g, dim).index_copy_(0, shared.slot_of_row, q).view(u, s, n_kv, g, dim)
    qg = qg.permute(0, 2, 1, 3, 4).reshape(u, n_kv, s * g, dim)
    op, lp = _partial_attention(qg, layer.prefix_k, layer.prefix_v, scaling, shared.prefix_bias)

    def back(t):  # [U, KVH, S*g, X] -> [B, KVH, g, X]
        x = t.view(u, n_kv, s, g, -1).permute(0, 2, 1, 3, 4).reshape(u * s, n_kv, g, -1)
        return x if shared.dense else x.index_select(0, shared.slot_of_row)

    # Completion part: every row against its own tokens (all of them valid); then the two softmaxes
    # merged: out = (e^lp op + e^ls os) / (e^lp + e^ls) = os + sigmoid(lp - ls) (op - os).
    os_, ls = _partial_attention(q, suffix_k, suffix_v, scaling)
    out = torch.lerp(os_, back(op), torch.sigmoid(back(lp) - ls).to(os_.dtype))
    return out.reshape(bsz, 1, n_kv * g, dim)


AttentionInterface.register(ATTN_IMPL, _decode_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_IMPL, sdpa_mask)


def use_fast_attention(model) -> None:
    """Route the model's attention through `_decode_attention` (SDPA for everything but 1-token decode)."""
    if getattr(model.config, "_attn_implementation", None) in ("sdpa", "eager", None, ATTN_IMPL):
        model.set_attn_implementation(ATTN_IMPL)


class _PreallocLayer(DynamicLayer):
    """KV layer that writes in place and returns views of the filled part.

    Capacity grows in chunks of `grow` tokens (one copy per chunk) rather than being reserved for
    the longest possible completion up front: rows that finish early leave the batch, so most of a
    full-length reservation would never be used.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int, grow: int = 32):
        super().__init__()
        self.kbuf, self.vbuf, self.length, self.grow = keys, values, length, grow
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._refresh()

    def _refresh(self):
        self.keys = self.kbuf[:, :, : self.length]
        self.values = self.vbuf[:, :, : self.length]

    def _reserve(self, n: int):
        need = self.length + n
        if need <= self.kbuf.shape[2]:
            return
        cap = need + self.grow
        b, h, _, d = self.kbuf.shape
        for name in ("kbuf", "vbuf"):
            old = getattr(self, name)
            new = old.new_empty(b, h, cap, d)
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)

    def update(self, key_states, value_states, *args, **kwargs):
        n = key_states.shape[-2]
        self._reserve(n)
        self.kbuf[:, :, self.length : self.length + n] = key_states
        self.vbuf[:, :, self.length : self.length + n] = value_states
        self.length += n
        self._refresh()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.kbuf = self.kbuf[:, :, : self.length + self.grow].index_select(0, indices)
        self.vbuf = self.vbuf[:, :, : self.length + self.grow].index_select(0, indices)
        self._refresh()


def _prealloc_cache(prefill: DynamicCache, rows: torch.Tensor, grow: int = 32) -> DynamicCache:
    """A cache holding `prefill`'s KV for each of `rows` (indices into its batch), growable."""
    cache = DynamicCache()
    layers = []
    for layer in prefill.layers:
        k, v = layer.keys, layer.values
        b, t = rows.numel(), k.shape[2]
        kbuf = k.new_empty(b, k.shape[1], t + grow, k.shape[3])
        vbuf = v.new_empty(b, v.shape[1], t + grow, v.shape[3])
        kbuf[:, :, :t] = k.index_select(0, rows)
        vbuf[:, :, :t] = v.index_select(0, rows)
        layers.append(_PreallocLayer(kbuf, vbuf, t, grow))
    cache.layers = layers
    return cache


class _SharedPrefix:
    """Which prompt each batch row continues, and the prompts' padding, shared by all layers."""

    def __init__(self, prompt_mask: torch.Tensor, row_prompt: torch.Tensor):
        self.n_prompts = prompt_mask.shape[0]
        self.device = prompt_mask.device
        bias = torch.zeros(prompt_mask.shape, dtype=torch.float32, device=self.device)
        bias.masked_fill_(prompt_mask == 0, torch.finfo(torch.float32).min)
        self.prefix_bias = bias[:, None, None, :]  # [U, 1, 1, Tp], 0 = attend
        self.set_rows(row_prompt)

    def set_rows(self, row_prompt: torch.Tensor) -> None:
        """row_prompt[b] = index of the prompt that batch row b continues (a few dozen rows: bookkeeping
        in Python, one small tensor on the cache's device)."""
        prompt_of = row_prompt.tolist()
        seen = [0] * self.n_prompts
        slot = []
        for i in prompt_of:
            slot.append(seen[i])
            seen[i] += 1
        self.slots = max(max(seen), 1)
        slot = [i * self.slots + r for i, r in zip(prompt_of, slot)]
        self.slot_of_row = torch.tensor(slot, dtype=torch.long, device=self.device)
        self.dense = slot == list(range(self.n_prompts * self.slots))


class _SharedPrefixLayer(_PreallocLayer):
    """A layer whose prompt keys/values ([U, KVH, Tp, D], one per distinct prompt) are shared by the
    rows continuing that prompt; `update` stores and returns only the rows' own (completion) KV, tagged
    so `_decode_attention` adds the prompt part. Only for models using `ATTN_IMPL`."""

    def __init__(self, prefix_k, prefix_v, n_rows: int, shared: _SharedPrefix, grow: int = 32):
        self.prefix_k, self.prefix_v, self.shared = prefix_k, prefix_v, shared
        _, h, _, d = prefix_k.shape
        super().__init__(prefix_k.new_empty(n_rows, h, grow, d), prefix_v.new_empty(n_rows, h, grow, d), 0, grow)

    def _refresh(self):
        super()._refresh()
        self.keys._grpo_layer = self

    def get_seq_length(self) -> int:
        return self.prefix_k.shape[2] + self.length


def _shared_prefix_cache(prefill: DynamicCache, prompt_mask, rows: torch.Tensor, grow: int = 32):
    shared = _SharedPrefix(prompt_mask, rows)
    cache = DynamicCache()
    cache.layers = [_SharedPrefixLayer(x.keys, x.values, rows.numel(), shared, grow) for x in prefill.layers]
    return cache, shared


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0
    stop_at_answer: bool = True
    seed: int | None = None
    # Share of rows that end (EOS) without a final-answer line and then get one begun for them: "\n####" is
    # written in place of the EOS and the row samples on (the number, then a stop). 0 = off. Training only.
    force_answer_line: float = 0.0
    # With force_answer_line_run_on False, a row whose text already holds a '####' answer, run on at the end of a line
    # ('134.#### 134'), is not forced: it ends as sampled. Only rows with no '####' answer get the hint.
    force_answer_line_run_on: bool = True
    # Run every float32 Linear on a oneDNN-packed copy of its weight for the call (`packed_linears`): the same
    # numbers up to float rounding, 0.68x the sampling time at a training step's 32 rows on 2 cores (bench), and
    # one more copy of the weights in memory while it runs.
    packed_weights: bool = False


def _onednn_linear() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _packed_forward(packed: torch.Tensor, bias: torch.Tensor | None):
    """A Linear's forward on its packed weight (the packed copy lives in the closure, nowhere else)."""

    def forward(x):
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    return forward


@contextlib.contextmanager
def packed_linears(model, rows: int, enabled: bool = True):
    """Inside, every float32 CPU `nn.Linear` of `model` (the LM head too) computes with a copy of its weight
    packed for oneDNN once, here; the weights themselves are untouched and the forwards are restored on leaving.

    Why: MKL's sgemm, behind `F.linear`, packs the weight matrix into its own layout on every call. A decode
    step multiplies a few rows by every weight of the model, so that re-packing (a read and a write of 540 MB
    for SmolLM2) costs more than the products; packed once, it is paid once per call (~0.5 s, ~500 MB).
    Measured, SmolLM2 on 2 cores, plain and packed calls alternating in one process (bench/packed_sampling.py,
    assets/packed_sampling.json): a training step's 32 rows 0.68x the time, an evaluation batch of 32 greedy
    answers 0.75x, the same tokens both times; inside a whole training run the saving was smaller (docs/
    performance.md). Packing only the LM head or only the layers gained nothing. Only for inference: the packed
    product has no gradient, so it is used where sampling runs under `torch.inference_mode`. Yields the number
    of layers packed (0 where oneDNN is not available, or disabled).
    """
    mods = []
    if enabled and _onednn_linear():
        mods = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.weight.dtype == torch.float32
                and m.weight.device.type == "cpu" and "forward" not in m.__dict__]
    done = []
    try:
        for m in mods:
            m.forward = _packed_forward(torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), max(1, rows)), m.bias)
            done.append(m)
        yield len(done)
    finally:
        for m in done:
            m.__dict__.pop("forward", None)


@dataclass
class GenerationOutput:
    completion_ids: list[list[int]]  # generated ids per row, EOS excluded
    stop_reasons: list[str]  # "eos" | "answer" | "length"
    # the end token each row sampled (None where it stopped at its answer line or its length): training puts it
    # back at the end of the completion, as TRL keeps it, so the model learns when to stop (trainer.py, 1)
    end_tokens: list[int | None] = field(default_factory=list)
    prompt_tokens: int = 0  # tokens actually prefilled (unique prompts)
    generated_tokens: int = 0
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    def trained_ids(self) -> list[list[int]]:
        """Each row's ids as training sees them: the sampled end token kept at the end, as TRL keeps it."""
        ends = self.end_tokens or [None] * len(self.completion_ids)
        return [c + [e] if e is not None else list(c) for c, e in zip(self.completion_ids, ends)]


def _sample(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> torch.Tensor:
    if p.temperature <= 0:
        return logits.argmax(-1)
    logits = logits / p.temperature
    if p.top_k and p.top_k < logits.shape[-1]:
        kth = torch.topk(logits, p.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if p.top_p < 1.0:
        sorted_p, idx = torch.sort(probs, dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < p.top_p
        sorted_p = sorted_p * keep
        cdf = sorted_p.cumsum(-1)
        u = _uniform(cdf.shape[0], gen, cdf.device) * cdf[:, -1:]
        pos = torch.searchsorted(cdf, u).clamp_(max=cdf.shape[-1] - 1)
        return idx.gather(-1, pos).squeeze(-1)
    return _inverse_cdf(probs, _uniform(probs.shape[0], gen, probs.device))


def _uniform(n: int, gen: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """n uniforms in [0, 1) as a column on `device`, drawn from the CPU generator `gen` (so a seed gives
    the same draws whatever device the model is on)."""
    return torch.rand(n, 1, generator=gen).to(device)


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor, block: int = 256) -> torch.Tensor:
    """The token at quantile u (in [0, 1)) of each row's distribution, exactly as a search in the cumulative
    sum would find it, but summing blocks of `block` tokens first and accumulating only inside the block
    that holds the quantile (a full-vocabulary cumsum is serial and was ~10 ms a step at batch 64)."""
    n, vocab = probs.shape
    pad = (-vocab) % block
    if pad:
        probs = torch.nn.functional.pad(probs, (0, pad))
    blocks = probs.view(n, -1, block)
    block_cdf = blocks.sum(-1).cumsum(-1)  # [n, vocab / block]
    tiny = torch.finfo(probs.dtype).tiny
    target = (u * block_cdf[:, -1:]).clamp_(min=tiny)  # > 0: never a block (or token) of zero mass
    b = torch.searchsorted(block_cdf, target).clamp_(max=block_cdf.shape[1] - 1)  # [n, 1]
    before = torch.where(b > 0, block_cdf.gather(1, (b - 1).clamp(min=0)), torch.zeros_like(target))
    inner_cdf = blocks[torch.arange(n, device=probs.device), b.squeeze(1)].cumsum(-1)  # [n, block]
    rest = torch.minimum((target - before).clamp_(min=tiny), inner_cdf[:, -1:])  # rounding stays inside
    j = torch.searchsorted(inner_cdf, rest).clamp_(max=block - 1)
    return (b * block + j).clamp_(max=vocab - 1).squeeze(-1)


class _AnswerLineDetector:
    """Says when a row has just completed a final-answer line. Decodes only rows that emitted a newline."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        # Byte-level BPE shows "\n" as "Ċ"; SentencePiece as "<0x0A>"; plain vocabularies as "\n".
        self.newline_ids = {
            i for i, t in enumerate(vocab) if t is not None and ("\n" in t or "Ċ" in t or t == "<0x0A>")
        }

    def done(self, ids: list[int]) -> bool:
        if not ids or ids[-1] not in self.newline_ids:
            return False
        return has_final_line(self.tokenizer.decode(ids, skip_special_tokens=True))


_DETECTORS: dict[int, _AnswerLineDetector] = {}


def _force_wanted(text: str, params: SamplingParams) -> bool:
    """Whether a row that sampled its end token lacks the answer line the hint writes: it has no final
    '#### <number>' line, and (unless `force_answer_line_run_on`) no '####' answer anywhere, run on or not."""
    if has_final_line(text):
        return False
    return params.force_answer_line_run_on or extract_final_answer(text) is None


def answer_line_start(tokenizer) -> list[int]:
    """The tokens a forced answer line begins with: a newline and '####' (the number is left to the model)."""
    return list(tokenizer("\n####", add_special_tokens=False)["input_ids"])


def _detector(tokenizer) -> _AnswerLineDetector:
    key = id(tokenizer)
    if key not in _DETECTORS:
        _DETECTORS[key] = _AnswerLineDetector(tokenizer)
    return _DETECTORS[key]


def _prefill(model, prompts: list, pad_id: int, length: int):
    """Run `prompts` left-padded to `length` in one batch: (its DynamicCache, last-position logits [n, V])."""
    inp = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    amask = torch.zeros((len(prompts), length), dtype=torch.long)
    for i, p in enumerate(prompts):
        inp[i, length - len(p) :] = torch.tensor(p)
        amask[i, length - len(p) :] = 1
    dev = _model_device(model)
    inp, amask = inp.to(dev), amask.to(dev)
    cache = DynamicCache()
    out = model(
        input_ids=inp,
        attention_mask=amask,
        position_ids=(amask.cumsum(-1) - 1).clamp(min=0),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return cache, out.logits[:, -1].float()


def _length_buckets(lengths: list[int], waste: float = 0.1) -> list[list[int]]:
    """Group indices of similar lengths so that padding each group to its longest adds <= `waste`."""
    buckets, cur, total = [], [], 0
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        if cur and lengths[i] * (len(cur) + 1) > (1 + waste) * (total + lengths[i]):
            buckets.append(cur)
            cur, total = [], 0
        cur.append(i)
        total += lengths[i]
    return [*buckets, cur] if cur else buckets


def _model_device(model) -> torch.device:
    return next(model.parameters()).device


def _bucketed_prefill(model, prompts: list, pad_id: int, plen: int):
    """Prefill prompts in buckets of similar length (GSM8K prompts vary ~2x: one padded batch spent ~27% of
    its FLOPs on padding), then lay their keys/values out right-aligned in [U, KVH, plen, D] buffers, the
    padding zeroed (the prompt mask hides it)."""
    from types import SimpleNamespace

    keys: list = []
    values: list = []
    first = None
    for bucket in _length_buckets([len(p) for p in prompts]):
        part = [prompts[i] for i in bucket]
        width = max(len(p) for p in part)
        cache, logits = _prefill(model, part, pad_id, width)
        idx = torch.tensor(bucket, dtype=torch.long, device=logits.device)
        if first is None:
            first = logits.new_empty(len(prompts), logits.shape[-1])
        first[idx] = logits
        for li, layer in enumerate(cache.layers):
            if li == len(keys):
                shape = (len(prompts), layer.keys.shape[1], plen, layer.keys.shape[3])
                keys.append(layer.keys.new_zeros(shape))
                values.append(layer.values.new_zeros(shape))
            keys[li][idx, :, plen - width :] = layer.keys
            values[li][idx, :, plen - width :] = layer.values
    return SimpleNamespace(layers=[SimpleNamespace(keys=k, values=v) for k, v in zip(keys, values)]), first


@torch.inference_mode()
def generate_completions(
    model,
    tokenizer,
    prompt_ids: list[list[int]],
    params: SamplingParams,
    eos_token_ids: list[int] | None = None,
    compact_below: float = 0.75,
    on_tokens=None,
    should_stop=None,
) -> GenerationOutput:
    """Sample one completion for each entry of `prompt_ids` (duplicates share one prefill).

    on_tokens(results): called after every decode step with the token ids generated so far per row
    (for streaming to a page). should_stop(): checked every step; True ends generation early
    (rows then stop with reason "length").
    """
    import time

    t0 = time.perf_counter()
    if eos_token_ids is None:
        eos = model.generation_config.eos_token_id
        eos_token_ids = [eos] if isinstance(eos, int) else list(eos or [tokenizer.eos_token_id])
    eos_set = set(eos_token_ids)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_token_ids[0]
    gen = None
    if params.seed is not None:
        gen = torch.Generator().manual_seed(params.seed)
    detector = _detector(tokenizer) if params.stop_at_answer else None
    if not 0.0 <= params.force_answer_line <= 1.0:
        raise ValueError(f"force_answer_line must be in [0, 1] (got {params.force_answer_line}).")
    forced_ids = answer_line_start(tokenizer) if params.force_answer_line > 0 else []
    queue: dict[int, list[int]] = {}  # row -> forced tokens still to write
    forced_rows: set[int] = set()  # rows given a line (once each)
    forced_at: dict[int, list[int]] = {}  # row -> positions in its completion of the tokens written for it
    forced_tokens = 0

    # 1. Prefill each distinct prompt once.
    uniq: dict[tuple, int] = {}
    row_src = []
    for ids in prompt_ids:
        row_src.append(uniq.setdefault(tuple(ids), len(uniq)))
    uniq_prompts = list(uniq)
    plen = max(len(p) for p in uniq_prompts)
    n_rows = len(prompt_ids)
    dev = _model_device(model)
    amask = torch.zeros((len(uniq_prompts), plen), dtype=torch.long)
    for i, p in enumerate(uniq_prompts):
        amask[i, plen - len(p) :] = 1
    amask = amask.to(dev)
    rows = torch.tensor(row_src, dtype=torch.long)  # bookkeeping stays on the CPU, rows_d goes to the model
    rows_d = rows.to(dev)
    was_training = model.training
    model.eval()
    packing = contextlib.ExitStack()
    try:
        packing.enter_context(packed_linears(model, n_rows, params.packed_weights))
        capacity = plen + params.max_new_tokens
        shared = None
        if getattr(model.config, "_attn_implementation", None) == ATTN_IMPL:
            prefill, first = _bucketed_prefill(model, uniq_prompts, pad_id, plen)
            cache, shared = _shared_prefix_cache(prefill, amask, rows)
        else:
            prefill, first = _prefill(model, uniq_prompts, pad_id, plen)
            cache = _prealloc_cache(prefill, rows_d)
        del prefill
        logits = first.index_select(0, rows_d)

        # With the shared-prompt cache the attention masks the prompts' padding itself (every completion
        # position is valid), so an attention mask is kept only for the plain cache.
        full_mask = None
        if shared is None:
            full_mask = torch.zeros((n_rows, capacity), dtype=torch.long, device=dev)
            full_mask[:, :plen] = amask.index_select(0, rows_d)
        next_pos = amask.sum(-1).index_select(0, rows_d)  # position of the next token per row
        active = torch.arange(n_rows)  # original row index of each batch row
        alive = [True] * n_rows  # per batch row: still generating
        results: list[list[int]] = [[] for _ in range(n_rows)]
        reasons = ["length"] * n_rows
        end_tokens: list[int | None] = [None] * n_rows
        cur = plen
        generated = 0
        for step in range(params.max_new_tokens):
            tok = _sample(logits, params, gen)
            toks = tok.tolist()
            replaced = False  # a forced token took a sampled one's place this step
            for j, (r, t) in enumerate(zip(active.tolist(), toks)):
                if not alive[j]:
                    continue
                if r in queue:  # writing a forced answer line: the sampled token is replaced
                    t = toks[j] = queue[r].pop(0)
                    forced_tokens, replaced = forced_tokens + 1, True
                    forced_at[r].append(len(results[r]))
                    if not queue[r]:
                        del queue[r]
                elif t in eos_set:
                    if (
                        forced_ids
                        and r not in forced_rows
                        and float(_uniform(1, gen, torch.device("cpu"))[0]) < params.force_answer_line
                        and _force_wanted(tokenizer.decode(results[r], skip_special_tokens=True), params)
                    ):
                        forced_rows.add(r)
                        t = toks[j] = forced_ids[0]
                        forced_tokens, replaced = forced_tokens + 1, True
                        forced_at[r] = [len(results[r])]
                        if len(forced_ids) > 1:
                            queue[r] = list(forced_ids[1:])
                    else:
                        reasons[r], alive[j], end_tokens[r] = "eos", False, t
                        continue
                results[r].append(t)
                generated += 1
                if detector is not None and detector.done(results[r]):
                    reasons[r], alive[j] = "answer", False
            if on_tokens is not None:
                on_tokens(results)
            n_alive = sum(alive)
            if n_alive == 0 or step == params.max_new_tokens - 1:
                break
            if should_stop is not None and should_stop():
                break
            # Finished rows ride along (their samples are ignored) until few enough remain that
            # copying the cache down to the live rows costs less than computing the dead ones.
            if replaced:
                tok = torch.tensor(toks, dtype=tok.dtype, device=tok.device)
            if n_alive < compact_below * len(alive):
                keep_t = torch.tensor([j for j, a in enumerate(alive) if a], dtype=torch.long)
                active = active.index_select(0, keep_t)
                keep_t = keep_t.to(dev)
                tok = tok.index_select(0, keep_t)
                if full_mask is not None:
                    full_mask = full_mask.index_select(0, keep_t)
                next_pos = next_pos.index_select(0, keep_t)
                for layer in cache.layers:
                    layer.batch_select_indices(keep_t)
                if shared is not None:
                    shared.set_rows(rows.index_select(0, active))
                alive = [True] * len(keep_t)
            if full_mask is not None:
                full_mask[:, cur] = 1
            out = model(
                input_ids=tok.unsqueeze(-1),
                attention_mask=None if full_mask is None else full_mask[:, : cur + 1],
                position_ids=next_pos.unsqueeze(-1),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            logits = out.logits[:, -1].float()
            next_pos = next_pos + 1
            cur += 1
    finally:
        packing.close()
        if was_training:
            model.train()
    return GenerationOutput(
        completion_ids=results,
        stop_reasons=reasons,
        end_tokens=end_tokens,
        prompt_tokens=sum(len(p) for p in uniq_prompts),
        generated_tokens=generated,
        seconds=time.perf_counter() - t0,
        extra={"forced_rows": sorted(forced_rows), "forced_tokens": forced_tokens, "forced_at": forced_at}
        if forced_ids
        else {},
    )
