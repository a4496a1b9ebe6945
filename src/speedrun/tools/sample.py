"""Text generation with a key-value cache: `speedrun sample` and the demo's sample.

The model's forward (`GPT.hidden`) takes a whole packed row, and its mask is
block-level (attention.py): a 128-token query block keeps its W nearest key
blocks. For a causal sampler we need the mask row of ONE new query. Because
document ids only grow along the row, the W-nearest-blocks rule reduces to a
token-level rule that needs no future tokens:

    query t sees key j  iff  j <= t, doc[j] == doc[t], block(j) > block(t) - W

(W clamped to >= 1; `window_mask` below, checked against `dense_mask` in the
tests). So each step runs the per-layer pieces the model exposes
(`attn.project`, `attn.finish`, the MLP) on the new tokens only, and attends
over cached keys and values from the window start. Sampling happens on the
CPU with a seeded generator, so a seed gives the same text on any device.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from speedrun.config import RecordRunConfig
from speedrun.errors import ConfigError
from speedrun.model.attention import document_ids
from speedrun.model.gpt import scalar_layout
from speedrun.train import stages


def window_mask(docs_q: Tensor, pos_q: Tensor, docs_k: Tensor, pos_k: Tensor,
                window_blocks: int, block_size: int) -> Tensor:
    """(Tq, Tk) bool: the document-causal block-window rule, token by token."""
    w = max(int(window_blocks), 1)
    causal = pos_k[None, :] <= pos_q[:, None]
    same_doc = docs_k[None, :] == docs_q[:, None]
    near = (pos_k // block_size)[None, :] > (pos_q // block_size)[:, None] - w
    return causal & same_doc & near


def final_window(model) -> int:
    """The long window (blocks) at the end of training."""
    from speedrun.train.schedules import window_blocks

    return window_blocks(1.0, model.attn_cfg)


class KVCache:
    """Keys and values of every attention layer for the tokens seen so far."""

    def __init__(self, model, capacity: int, window_blocks: int, dtype: torch.dtype):
        self.model, self.dtype = model, dtype
        cfg = model.cfg
        if cfg.positions == "learned" and capacity > cfg.max_positions:
            raise ConfigError(f"--max-new-tokens: prompt + new tokens = {capacity} exceeds the model's "
                              f"max_positions={cfg.max_positions} (learned positions)")
        device = model.embed.weight.device
        shape = (1, capacity, cfg.num_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) if b.attn else None for b in model.blocks]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) if b.attn else None for b in model.blocks]
        long = torch.tensor(window_blocks)
        self.windows = [int(w) for w in model.window_pair(long)]
        self.tokens = torch.zeros(0, dtype=torch.long, device=device)
        self.device = device

    def doc_ids(self) -> Tensor:
        """Document id of every token so far, by the same rule as `GPT.masks`."""
        tokens, a = self.tokens, self.model.attn_cfg
        docs = document_ids(tokens) if a.doc_mask else torch.zeros_like(tokens)
        if a.segment_len:
            docs = docs + torch.arange(tokens.numel(), device=tokens.device) // a.segment_len * (tokens.numel() + 1)
        return docs

    def _attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, start: int, docs: Tensor, long: bool) -> Tensor:
        """Store k, v at [start, start+T) and attend q over the cache."""
        end = start + q.shape[1]
        self.k[layer][:, start:end], self.v[layer][:, start:end] = k, v
        bs = self.model.attn_cfg.block_size
        w = self.windows[0] if long else self.windows[1]
        lo = max(0, (start // bs - max(w, 1) + 1) * bs)
        pos = torch.arange(end, device=self.device)
        mask = window_mask(docs[start:end], pos[start:end], docs[lo:end], pos[lo:end], w, bs)
        keys, values = self.k[layer][:, lo:end], self.v[layer][:, lo:end]
        attn = self.model.blocks[layer].attn
        y = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                           attn_mask=mask, scale=attn.scale)
        return y.transpose(1, 2)

    @torch.no_grad()
    def extend(self, new_tokens: Tensor) -> Tensor:
        """Feed tokens (T,); returns soft-capped float32 logits of the last one (padded_vocab,)."""
        m, cfg = self.model, self.model.cfg
        start = self.tokens.numel()
        new_tokens = new_tokens.to(self.device)
        self.tokens = torch.cat([self.tokens, new_tokens])
        docs = self.doc_ids()
        pos = m.positions(new_tokens.numel(), self.device, offset=start)
        rope = m.rope(pos, start + new_tokens.numel())
        ve = [emb(new_tokens).to(self.dtype)[None] for emb in m.value_embeds]
        x = x0 = m.embed_tokens(new_tokens, pos, self.dtype)[None]
        lay = scalar_layout(cfg.num_layers)
        skip_w, block_l, attn_l = m.scalars[lay["skip"]], m.scalars[lay["block"]], m.scalars[lay["attn"]]
        L, n_skip = cfg.num_layers, cfg.num_layers // 2 if cfg.unet else 0
        stack, v_first = [], None
        for i, block in enumerate(m.blocks):
            if i >= L - n_skip:
                x = x + skip_w[i - (L - n_skip)] * stack.pop()
            if cfg.x0_lambdas:
                x = block_l[2 * i] * x + block_l[2 * i + 1] * x0
            if block.attn is not None:
                h = block.norm1(x)
                vi = m.value_embed_for(i)
                vei = ve[vi] if vi is not None else v_first
                q, k, v = block.attn.project(h, vei, attn_l[2 * i: 2 * i + 2], rope)
                if cfg.value_residual and v_first is None:
                    v_first = v  # the value residual: later layers mix in the first layer's V
                y = self._attend(i, q, k, v, start, docs, m.is_long(i))
                x = x + block.attn.finish(y, h)
            x = x + block.mlp(block.norm2(x))
            if i < n_skip:
                stack.append(x)
        h = m.final_norm(x)[0, -1]
        return m.softcap(F.linear(h, m.head_weight.type_as(h)))


def pick_token(logits: Tensor, vocab_size: int, temperature: float, top_k: int,
               generator: torch.Generator | None) -> int:
    """Greedy when temperature <= 0; else top-k sampling. Padded ids never chosen."""
    logits = logits[:vocab_size].float().cpu()
    if temperature <= 0:
        return int(logits.argmax())
    logits = logits / temperature
    if top_k and top_k < vocab_size:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator))


@torch.no_grad()
def generate(model, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.8, top_k: int = 50,
             window_blocks: int | None = None, dtype: torch.dtype = torch.float32, seed: int | None = None) -> list[int]:
    """The `max_new_tokens` ids that follow `prompt_ids` (prompt not included)."""
    if not prompt_ids:
        raise ConfigError("--prompt: empty prompt (give at least one token)")
    w = final_window(model) if window_blocks is None else int(window_blocks)
    cache = KVCache(model, len(prompt_ids) + max_new_tokens, w, dtype)
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    logits = cache.extend(torch.tensor(prompt_ids, dtype=torch.long))
    out: list[int] = []
    for _ in range(max_new_tokens):
        out.append(pick_token(logits, model.cfg.vocab_size, temperature, top_k, gen))
        if len(out) < max_new_tokens:
            logits = cache.extend(torch.tensor([out[-1]], dtype=torch.long))
    return out


def generate_text(model, prompt: str, max_new_tokens: int, window_blocks: int | None = None,
                  dtype: torch.dtype = torch.float32, temperature: float = 0.8, top_k: int = 50, seed: int = 0) -> str:
    """Prompt plus continuation as text. The prompt starts a document (EOT first), as in training."""
    from speedrun.data.tokenizer import EOT, decode, encode

    ids = generate(model, [EOT, *encode(prompt)], max_new_tokens, temperature, top_k, window_blocks, dtype, seed)
    return prompt + decode(ids)


@torch.no_grad()
def generate_record(model, prompt_ids: list[int], max_new_tokens: int, windows: tuple[int, int], attn_scale: float,
                    freqs: Tensor | None = None, temperature: float = 0.8, top_k: int = 50,
                    dtype: torch.dtype = torch.float32, seed: int | None = None) -> list[int]:
    """`generate` for the 2026 record's `RecordGPT`, through its key-value cache (record_decode.py) at
    the given windows, softmax scale and rotary frequencies (the final validation's, in a run)."""
    from speedrun.data.tokenizer import get_encoding
    from speedrun.tools.record_decode import RecordDecoder

    if not prompt_ids:
        raise ConfigError("--prompt: empty prompt (give at least one token)")
    decoder = RecordDecoder(model, windows, attn_scale, freqs, dtype)
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    logits, vocab = decoder.prefill(torch.tensor(prompt_ids, dtype=torch.long)), get_encoding().n_vocab
    out: list[int] = []
    for _ in range(max_new_tokens):
        out.append(pick_token(logits, vocab, temperature, top_k, gen))
        if len(out) < max_new_tokens:
            logits = decoder.step(out[-1])
    return out


def generate_record_text(model, prompt: str, max_new_tokens: int, windows: tuple[int, int], attn_scale: float,
                         freqs: Tensor | None = None, dtype: torch.dtype = torch.float32, temperature: float = 0.8,
                         top_k: int = 50, seed: int = 0) -> str:
    """Prompt plus continuation as text, the prompt starting a document (EOT first)."""
    from speedrun.data.tokenizer import EOT, decode, encode

    ids = generate_record(model, [EOT, *encode(prompt)], max_new_tokens, windows, attn_scale, freqs, temperature,
                          top_k, dtype, seed)
    return prompt + decode(ids)


# ------------------------------------------------------------------ command


def register(subparsers) -> None:
    p = subparsers.add_parser("sample", help="generate text from a trained model (key-value cached)")
    p.add_argument("--ckpt", required=True, help="model folder (a finished run, or holding model.safetensors + config.json)")
    p.add_argument("--prompt", default="It was a dark and stormy night", help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate (default 64)")
    p.add_argument("--temperature", type=float, default=0.8, help="softmax temperature; 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=50, help="sample among the k likeliest tokens; 0 = all (default 50)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    p.set_defaults(func=cli_sample)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"--device {name}: not a device (use cpu, cuda, cuda:N or auto)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: CUDA is not available on this machine")
    return device


def cli_sample(args: argparse.Namespace) -> int:
    from speedrun.run.checkpoint import load_model

    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens: must be >= 1, got {args.max_new_tokens}")
    if not (math.isfinite(args.temperature) and args.temperature >= 0):  # 0 is greedy; below 0 means nothing
        raise ConfigError(f"--temperature: must be >= 0 (0 = greedy), got {args.temperature}")
    if args.top_k < 0:
        raise ConfigError(f"--top-k: must be >= 0 (0 = all tokens), got {args.top_k}")
    model, cfg = load_model(args.ckpt, resolve_device(args.device))
    if isinstance(cfg, RecordRunConfig):
        ev = stages.final_evaluation(cfg.stages, cfg.model.rope_pairs, cfg.model.rope_base)
        text = generate_record_text(model, args.prompt, args.max_new_tokens, ev.windows, ev.attn_scale, ev.freqs,
                                    temperature=args.temperature, top_k=args.top_k, seed=args.seed)
    else:
        text = generate_text(model, args.prompt, args.max_new_tokens, temperature=args.temperature,
                             top_k=args.top_k, seed=args.seed)
    print(text)
    return 0
