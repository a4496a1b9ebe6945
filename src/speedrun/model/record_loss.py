"""The 2026-07 record's head loss: multi-token prediction plus a prefix-token term.

Spec: `shared/spec/record-2026-07.md`, "Head and loss". With ẑ = 23·σ((z + 5)/7.5)
over all V columns (the padding columns take part in the softmax), the training
loss of a packed local batch of n tokens is

    Σ_t ℓ_t,  ℓ_t = Σ_k w_k·CE(ẑ_t, x[t+k+1]) + π·CE(ẑ_t, T′(x[t+1])),

where the k-th term is dropped when t + k ≥ n (its target lies past the local
batch), and the prefix term is used only where T′ exists. Targets are not
masked at document boundaries. The result is the SUM over tokens, not the mean:
the trainer backpropagates grad_scale × this sum ("Loss normalisation").

Why it is built this way:

* Plain PyTorch, one log-softmax. Every term reads the same row's softmax, so
  the (n, V) log-probabilities are computed once in float32, and every term's
  log-probability comes from one gather of an (n, K + 1) table of columns with
  their weights: term k pairs row t with target x[t+k+1], weighted 0 where
  t + k ≥ n (which drops the terms past the end; never a wrap-around). Its
  backward is one scatter into one (n, V) gradient, where a gather per term
  made a zeroed gradient, a slice's copy and an add each (on the 2-core CI CPU
  at n = 512: 239 → 152 ms forward and backward, 2026-12-07; the gradient the
  same bits). This is the reference that a fused kernel is tested against, not
  the fast path: it holds the (n, V) float32 softcap and log-softmax in memory.
* The prefix table T′ is built from tiktoken's public vocabulary access
  (`decode_single_token_bytes`, `is_special_token`): a dict bytes → id over the
  mergeable ranks, then for each token its proper prefixes are tried from the
  longest down. Every single byte is a GPT-2 token, so the walk is short and
  the table builds in well under a second (the record builds it inside the
  timed region). Ids that are not mergeable ranks (BOS, the padding) get −1.
* The softcap is the model's (`record_parts.softcap`), written once; the MTP
  weights and π change every step (the schedule), so they are arguments.

CE gradient (spec, "Unresolved / ambiguous"): the record's fused kernel writes
the logit gradient with the softmax weight S = Σ_k w_k (+ π where T′ exists)
at EVERY position, including the last K−1 positions whose later MTP terms are
dropped from the loss. `record_training_loss` is differentiated by autograd, so
its gradient is the exact gradient of the loss it reports: at position t the
softmax weight is Σ_{k : t+k<n} w_k (+ π where T′ exists). A kernel test that
compares against this function must therefore either compare only rows
t ≤ n − K, or add the kernel's extra (Σ_{k : t+k≥n} w_k)·p_t to the reference
gradient on the last K−1 rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import tiktoken
import torch
import torch.nn.functional as F
from torch import Tensor

from speedrun.model.record_parts import softcap

PADDED_VOCAB = 50304  # GPT-2's 50,257 ids padded to a multiple of 128 (spec, "Model")
NO_PREFIX = -1
EVAL_CHUNK = 8192  # rows of logits softcapped at once in `record_eval_loss`


def _token_bytes(encoding: tiktoken.Encoding) -> dict[int, bytes]:
    """id → byte string for the mergeable ranks only (special tokens such as BOS left out)."""
    out = {}
    for i in range(encoding.n_vocab):
        if encoding.is_special_token(i):
            continue
        try:
            out[i] = encoding.decode_single_token_bytes(i)
        except KeyError:  # a hole in the ranks: no token has this id
            continue
    return out


def _longest_proper_prefix(b: bytes, ids: dict[bytes, int]) -> int:
    """The id of the longest proper prefix of b that is a token, else NO_PREFIX."""
    for length in range(len(b) - 1, 0, -1):
        hit = ids.get(b[:length])
        if hit is not None:
            return hit
    return NO_PREFIX


def prefix_table(encoding: tiktoken.Encoding, padded_vocab: int = PADDED_VOCAB) -> Tensor:
    """T′ as an int64 tensor (padded_vocab,): the longest proper-prefix token of each id, else −1.

    Single bytes have no proper prefix; BOS and the padding ids (≥ n_vocab) are −1. A model whose
    vocabulary is smaller than the encoding's (a test's) keeps the tokens and prefixes below its size.
    int64 so that it indexes and gathers without a cast.
    """
    by_id = {i: b for i, b in _token_bytes(encoding).items() if i < padded_vocab}
    by_bytes = {b: i for i, b in by_id.items()}
    table = [NO_PREFIX] * padded_vocab
    for i, b in by_id.items():
        table[i] = _longest_proper_prefix(b, by_bytes)
    return torch.tensor(table, dtype=torch.int64)


def record_training_loss(z: Tensor, targets_next: Tensor, mtp_weights: Sequence[float] | Tensor,
                         prefix_weight: float | Tensor, prefix: Tensor) -> Tensor:
    """The summed training loss of one packed local batch: a float32 scalar (float64 for float64 z).

    z: raw logits (n, V) in any float dtype; targets_next: int64 (n,), targets_next[t] = x[t+1];
    mtp_weights: w_0..w_{K−1}; prefix_weight: π; prefix: the T′ table (`prefix_table`).
    See the module docstring for the formula and for what the gradient is. The weights may be
    tensors (a compiled step then keeps one graph per stage, not one per value); a tensor π always
    adds its term, a float π of 0 leaves it out.
    """
    logp = F.log_softmax(softcap(z), dim=-1)
    columns, weights = _term_columns(targets_next, mtp_weights, prefix_weight, prefix, logp.dtype)
    return -(logp.gather(1, columns) * weights).sum()


def _term_columns(targets_next: Tensor, mtp_weights: Sequence[float] | Tensor, prefix_weight: float | Tensor,
                  prefix: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Each row's target column and weight in each term, (n, K) or (n, K + 1) with the prefix term:
    term k's column at row t is x[t+k+1] with weight w_k, or weight 0 where t + k ≥ n (the target lies
    past the batch; a term with k ≥ n drops whole); the prefix term's is T′(x[t+1]) with weight π,
    or 0 where T′ has no entry (its column clamped to a real one)."""
    n, dev = targets_next.shape[0], targets_next.device
    w = torch.as_tensor(mtp_weights, dtype=dtype, device=dev)[:n]
    at = torch.arange(n, device=dev)[:, None] + torch.arange(w.shape[0], device=dev)  # t + k
    columns = targets_next[at.clamp(max=max(n - 1, 0))]
    weights = torch.where(at < n, w, 0.0)
    if isinstance(prefix_weight, Tensor) or prefix_weight:
        pre = prefix.to(device=dev, dtype=torch.int64)[targets_next]
        columns = torch.cat((columns, pre.clamp(min=0)[:, None]), dim=1)
        weights = torch.cat((weights, ((pre >= 0).to(dtype) * prefix_weight)[:, None]), dim=1)
    return columns, weights


def record_eval_loss(z: Tensor, targets: Tensor, chunk: int = EVAL_CHUNK) -> Tensor:
    """Mean next-token cross-entropy (float32) of bf16 logits z (n, V) against targets (n,).

    No MTP or prefix terms. Rows are softcapped `chunk` at a time, so a 262,144-token
    validation chunk never holds all its float32 logits at once.
    """
    total = z.new_zeros((), dtype=torch.promote_types(z.dtype, torch.float32))
    for i in range(0, z.shape[0], chunk):
        s = softcap(z[i : i + chunk])
        total = total + F.cross_entropy(s, targets[i : i + chunk], reduction="sum")
    return total / z.shape[0]
