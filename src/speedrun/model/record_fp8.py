"""The 2026-07 record's FP8 products as plain-PyTorch references, with the MLP's delayed scales.

Spec: `shared/spec/record-2026-07.md`, "FP8 (training only; bf16 everywhere else)". The record
runs three kinds of product in FP8 during training: the language-model head (static scales, e5m2
gradient), the MLP up-projection (amax scales from the current tensors) and the MLP
down-projection (delayed scales: the activation's from the previous training forward, W2's from
the previous refresh). Everything else, the whole eval path included, is bf16.

Why it is built this way:

* These are the references a fused GPU path is held to, so each product is written out rather
  than fast: the FP8 operands are made by a real cast to `torch.float8_e4m3fn` / `float8_e5m2`
  (available on the CPU), dequantised to float32, multiplied in float32 and rounded once to the
  output dtype. Every product of two FP8 values is exact in float32, so this is what
  `torch._scaled_mm` (or the record's Triton FP8 kernels) computes on a GPU, up to the order in
  which the float32 accumulator adds the terms ("fast accumulation" changes only that order and
  its intermediate precision): a GPU path matches these to accumulation rounding, not bit for bit.
* Scales are 0-d float32 tensors on the operands' device, never Python numbers read back from a
  device (no host sync), and the combined scale of a product is the float32 product of the two
  operand scales, as `_scaled_mm` receives them.
* The quantisation divides by the stored scale (x / s), so the same float32 scale that makes an
  operand dequantises it. The activation a of the up-projection is the exception the spec writes
  out: a·448 is exact in float32 for a bf16 a, so e4m3(a·448 / max|a|) rounds once.
* Saturation is explicit where the spec asks for it (the post activation's min(·, 448), W2's
  clamp to ±448, the e5m2 gradient at ±57,344), because a plain cast's overflow differs by
  version and backend: torch 2.13's e4m3fn conversion saturates to ±448, earlier c10 conversions
  return NaN, and every e5m2 cast overflows to ±inf. The head's e4m3 casts are unclamped, as the
  record's are: the spec expects |x| ≤ 100 and |W| ≤ 1.6 there, and outside that range the result
  is the backend's (the record relies on not reaching it).
* A zero amax would make a scale 0 and a quantisation 0/0 = NaN; W2 starts at zero, so the
  bootstrap refresh before training meets exactly this. Every amax scale is therefore floored at
  `Fp8Config.scale_floor` (the smallest normal float32): an all-zero tensor then quantises to
  zeros and the product is exactly 0, and any nonzero bf16 weight or activation of the model
  gives a scale far above the floor, so nothing else changes.
* The delayed scales are state that outlives a step, so they live in one small object per MLP
  layer (`Fp8MlpState`) with a `state_dict` that carries the scales and the quantised weights: a
  resumed run makes the next forward bit for bit (a checkpoint is taken after a step's refresh,
  and that refresh's scale came from the refresh before it, which the weights alone cannot give).
* The MLP backward is bf16 on the bf16 post and the bf16 weights (not on the FP8 operands), with
  relu(pre) recovered as √post, as the record's kernel does; each bf16 product here is an fp32
  product of the bf16 operands rounded once to bf16 (fp32 accumulation), and the element-wise
  2·h·√post is computed in fp32 and rounded once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
BF16 = torch.bfloat16
F32 = torch.float32


@dataclass(frozen=True)
class Fp8Config:
    """The record's FP8 constants (spec "FP8 (training only; bf16 everywhere else)" and, for the
    bootstrap count, "Scaling the schedule": an absolute-step constant that does not scale)."""

    head_x_scale: float = 100 / 448  # x_s: the final normed x is expected within ±100
    head_w_scale: float = 1.6 / 448  # w_s: the head weights are expected within ±1.6
    head_grad_factor: float = 0.75 / 448  # grad_s = grad_scale · this
    e4m3_max: float = 448.0
    e5m2_max: float = 57344.0
    act_headroom: float = 1.80  # s_act = 1.80 · max(post of the previous training forward) / 448
    act_scale_init: float = 1.0  # s_act before the first training forward
    w2_headroom: float = 1.12  # each refresh stores 1.12 · max|W2| / 448 for the next one
    bootstrap_refreshes: int = 16  # the refreshes after steps 0..15 bootstrap (forwards 0..16)
    scale_floor: float = 2.0**-126  # an all-zero tensor quantises to zeros, not 0/0


RECORD_FP8 = Fp8Config()


# ---------------------------------------------------------------- shared pieces


def _scalar(value: float | Tensor, like: Tensor) -> Tensor:
    """A 0-d float32 tensor on like's device (a tensor value stays on the device: no host read)."""
    if isinstance(value, Tensor):
        return value.to(device=like.device, dtype=F32).reshape(())
    return torch.full((), value, dtype=F32, device=like.device)


def max_by_rows(t: Tensor) -> Tensor:
    """max(t) as the rows' maxima, then theirs (the same value: a maximum is exact in any order): a
    reduction over the same (rows, columns) loop as the pass that makes t, which Inductor can then fuse
    into that pass, where one reduction over every element is split into chunks of its own that read t
    again (the FP8 MLP's post: 8.9 ms a step at stage 2 on an H200, 2026-12-06)."""
    return t.detach().amax(dim=-1).amax()


def amax_scale(t: Tensor, headroom: float, cfg: Fp8Config = RECORD_FP8) -> Tensor:
    """headroom · max|t| / 448 as a 0-d float32 tensor, floored at cfg.scale_floor."""
    return scale_from_amax(max_by_rows(t.detach().abs()), headroom, cfg)


def scale_from_amax(amax: Tensor, headroom: float, cfg: Fp8Config = RECORD_FP8) -> Tensor:
    """headroom · amax / 448 in float32, floored at cfg.scale_floor (`amax_scale` of a tensor whose
    largest magnitude is amax)."""
    return (amax.to(F32) * headroom / cfg.e4m3_max).clamp_min(cfg.scale_floor)


def reference_product(a_f8: Tensor, b_f8_t: Tensor, scale: Tensor, out_dtype: torch.dtype) -> Tensor:
    """(a_f8 · b_f8_tᵀ) · scale in float32, rounded once to out_dtype: `_scaled_mm`'s result up to
    the accumulation order. The seam of the GPU's scaled product (kernels/record_fp8.py)."""
    acc = a_f8.to(F32) @ b_f8_t.to(F32).T
    return (acc * scale).to(out_dtype)


Product = Callable[[Tensor, Tensor, Tensor, torch.dtype], Tensor]


def _mm_bf16(x: Tensor, y: Tensor) -> Tensor:
    """x · y of bf16 operands with fp32 accumulation, rounded once to bf16: torch's bf16 product,
    which accumulates in float32. Never written as a float32 product of upcast operands: the same
    numbers up to the order of accumulation, but on a GPU without tensor cores, about ten times
    slower (it made the record's MLP backward most of its step, measured 2026-12-06)."""
    return x.to(BF16) @ y.to(BF16)


def saturating_e5m2(x: Tensor, cfg: Fp8Config = RECORD_FP8) -> Tensor:
    """float32 x clamped to ±57,344 (e5m2's largest finite value) and cast to e5m2: values past
    the range stay finite instead of becoming ±inf; NaN stays NaN."""
    return x.to(F32).clamp(-cfg.e5m2_max, cfg.e5m2_max).to(E5M2)


# ---------------------------------------------------------------- the head


def head_quantize_input(x: Tensor, cfg: Fp8Config = RECORD_FP8) -> Tensor:
    """x_f8 = e4m3(x / x_s), x (n, 768), unclamped (the record's cast)."""
    return (x.to(F32) / cfg.head_x_scale).to(E4M3)


def head_quantize_weight(w: Tensor, cfg: Fp8Config = RECORD_FP8) -> Tensor:
    """w_f8 = e4m3(W / w_s), W stored (in, out) = (768, V), unclamped (the record's cast)."""
    return (w.to(F32) / cfg.head_w_scale).to(E4M3)


def head_forward(x_f8: Tensor, w_f8: Tensor, cfg: Fp8Config = RECORD_FP8,
                 product: Product = reference_product) -> Tensor:
    """bf16 logits (n, V) = (x_f8·x_s)·(w_f8·w_s), w_f8 (768, V)."""
    scale = _scalar(cfg.head_x_scale, x_f8) * _scalar(cfg.head_w_scale, x_f8)
    return product(x_f8, w_f8.T, scale, BF16)


def head_grad_scale(grad_scale: float, cfg: Fp8Config = RECORD_FP8) -> float:
    """grad_s = grad_scale · 0.75 / 448 (grad_scale = 1 / grad_accum)."""
    return grad_scale * cfg.head_grad_factor


def head_quantize_grad(g: Tensor, grad_s: float, cfg: Fp8Config = RECORD_FP8) -> Tensor:
    """The logit gradient g (n, V) stored as e5m2(g / grad_s), saturating."""
    return saturating_e5m2(g.to(F32) / grad_s, cfg)


def head_grad_x(g_f8: Tensor, w_f8: Tensor, grad_s: float | Tensor, cfg: Fp8Config = RECORD_FP8,
                product: Product = reference_product) -> Tensor:
    """grad_x (n, 768) = (g_f8·grad_s)·(w_f8·w_s)ᵀ in bf16."""
    scale = _scalar(grad_s, g_f8) * _scalar(cfg.head_w_scale, g_f8)
    return product(g_f8, w_f8, scale, BF16)


def head_grad_w(x_f8: Tensor, g_f8: Tensor, grad_s: float | Tensor, cfg: Fp8Config = RECORD_FP8,
                product: Product = reference_product) -> Tensor:
    """grad_W (768, V) = (x_f8·x_s)ᵀ·(g_f8·grad_s) in float32 (the weight's (in, out) layout)."""
    scale = _scalar(cfg.head_x_scale, x_f8) * _scalar(grad_s, x_f8)
    return product(x_f8.T, g_f8.T, scale, F32)


class _Fp8Head(torch.autograd.Function):
    """The head as a differentiable product: FP8 forward, e5m2 gradient in the backward. The
    record's fused cross-entropy makes g itself; here g is the incoming logit gradient."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, grad_scale: float, cfg: Fp8Config, product: Product) -> Tensor:
        x_f8, w_f8 = head_quantize_input(x, cfg), head_quantize_weight(w, cfg)
        ctx.save_for_backward(x_f8, w_f8)
        ctx.grad_s, ctx.cfg, ctx.product = head_grad_scale(grad_scale, cfg), cfg, product
        return head_forward(x_f8, w_f8, cfg, product)

    @staticmethod
    def backward(ctx, g: Tensor):
        x_f8, w_f8 = ctx.saved_tensors
        g_f8 = head_quantize_grad(g, ctx.grad_s, ctx.cfg)
        grad_x = head_grad_x(g_f8, w_f8, ctx.grad_s, ctx.cfg, ctx.product)
        return grad_x, head_grad_w(x_f8, g_f8, ctx.grad_s, ctx.cfg, ctx.product), None, None, None


def fp8_head(x: Tensor, w: Tensor, grad_scale: float, cfg: Fp8Config = RECORD_FP8,
             product: Product = reference_product) -> Tensor:
    """Logits x (n, 768) · W (768, V) in FP8 (training); grad_x bf16, grad_W float32 (autograd then
    stores it in W's dtype, as the record does). `product` makes each scaled product."""
    return _Fp8Head.apply(x, w, grad_scale, cfg, product)


# ---------------------------------------------------------------- MLP quantisation


def quantize_activation(a: Tensor, cfg: Fp8Config = RECORD_FP8) -> tuple[Tensor, Tensor]:
    """a_f8 = e4m3(a·448 / max|a|) per tensor, and its scale max|a| / 448."""
    amax = max_by_rows(a.detach().abs()).to(F32).clamp_min(cfg.scale_floor * cfg.e4m3_max)
    a_f8 = (a.to(F32) * cfg.e4m3_max / amax).to(E4M3)
    return a_f8, amax / cfg.e4m3_max


def quantize_w1(w1: Tensor, s_w1: Tensor) -> Tensor:
    """W1_f8 = e4m3(W1 / s_W1), W1 (3072, 768); s_W1 = max|W1| / 448 keeps it in range."""
    return (w1.to(F32) / s_w1).to(E4M3)


def quantize_w2_t(w2: Tensor, s_w2: Tensor, cfg: Fp8Config = RECORD_FP8) -> Tensor:
    """W2_f8 = e4m3(clamp(W2 / s_W2, ±448)) stored transposed: W2 (3072, 768) → (768, 3072)
    contiguous, the layout whose transpose a scaled product reads as its second operand. The
    clamp matters because s_W2 is delayed: W2 may have grown past it since."""
    q = (w2.to(F32) / s_w2).clamp(-cfg.e4m3_max, cfg.e4m3_max).to(E4M3)
    return q.T.contiguous()


def quantize_post(post: Tensor, s_act: Tensor, cfg: Fp8Config = RECORD_FP8) -> Tensor:
    """post_f8 = e4m3(min(post / s_act, 448)); post = relu(pre)² ≥ 0, so only the top saturates."""
    return (post.to(F32) / s_act).clamp(max=cfg.e4m3_max).to(E4M3)


# ---------------------------------------------------------------- MLP products


def mlp_up_fp8(a: Tensor, w1_f8: Tensor, s_w1: Tensor, cfg: Fp8Config = RECORD_FP8,
               product: Product = reference_product) -> tuple[Tensor, Tensor]:
    """pre = (a_f8·W1_f8ᵀ)·s_W1·max|a|/448 in bf16 and post = relu(pre)² in bf16, a (n, 768)."""
    a_f8, s_a = quantize_activation(a, cfg)
    pre = product(a_f8, w1_f8, s_w1 * s_a, BF16)
    post = pre.to(F32).relu().square().to(BF16)
    return pre, post


def mlp_up_quantized(a: Tensor, w1_f8: Tensor, s_w1: Tensor, s_act: Tensor, cfg: Fp8Config = RECORD_FP8,
                     product: Product = reference_product) -> tuple[Tensor, Tensor, Tensor]:
    """The FP8 forward up to the down-product: post (`mlp_up_fp8`), post_f8 = `quantize_post`(post,
    s_act) and max(post) (0-d, post ≥ 0), from which the next s_act is made."""
    _, post = mlp_up_fp8(a, w1_f8, s_w1, cfg, product)
    return post, quantize_post(post, s_act, cfg), max_by_rows(post)


def mlp_down_quantized(post_f8: Tensor, w2_f8_t: Tensor, s_w2: Tensor, s_act: Tensor,
                       product: Product = reference_product) -> Tensor:
    """out (n, 768) = (post_f8·s_act)·(W2_f8·s_W2) in bf16, W2_f8 held transposed (768, 3072)."""
    return product(post_f8, w2_f8_t, s_act * s_w2, BF16)


def mlp_down_fp8(post: Tensor, w2_f8_t: Tensor, s_w2: Tensor, s_act: Tensor,
                 cfg: Fp8Config = RECORD_FP8, product: Product = reference_product) -> Tensor:
    """`mlp_down_quantized` of `quantize_post`(post, s_act)."""
    return mlp_down_quantized(quantize_post(post, s_act, cfg), w2_f8_t, s_w2, s_act, product)


def mlp_backward_bf16(g: Tensor, a: Tensor, w1: Tensor, w2: Tensor, post: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(da, dW1, dW2) in bf16 for the upstream gradient g (n, 768): relu(pre) = √post in bf16 (the
    spec's bf16 backward; for a bf16 relu(pre) in range it is exactly that value, `relu2_mlp`'s
    docstring), dpre = 2·(g·W2ᵀ)·√post rounded once, dW2 = postᵀ·g, dW1 = dpreᵀ·a, da = dpre·W1.
    The seam of `RecordKernels.mlp_backward`, whose kernel makes dpre in the product's epilogue."""
    h = _mm_bf16(g, w2.T)
    dpre = (2.0 * h.to(F32) * post.to(BF16).sqrt().to(F32)).to(BF16)
    return _mm_bf16(dpre, w1), _mm_bf16(dpre.T, a), _mm_bf16(post.T, g)


MlpBackward = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]


def mlp_reference(a: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    """The bf16 MLP relu(a·W1ᵀ)²·W2 (spec "MLP"): the eval path and what FP8 is held to. Each
    product and the square are rounded to bf16; differentiable by autograd."""
    pre = _mm_bf16(a, w1.T)
    post = pre.to(F32).relu().square().to(BF16)
    return _mm_bf16(post, w2)


# ---------------------------------------------------------------- delayed scales


def refresh_bootstraps(after_step: int, cfg: Fp8Config = RECORD_FP8) -> bool:
    """Whether the refresh after step `after_step` bootstraps W2's scale (−1: the refresh before
    training or after the warm-up reset). Steps 0..15 do, so forwards 0..16 use bootstrap scales."""
    return after_step < cfg.bootstrap_refreshes


class Fp8MlpState:
    """One MLP layer's FP8 state: s_act (delayed activation scale), s_W1 and W1_f8, s_W2 (the
    scale W2_f8 was made with), s_W2_next (the scale the next refresh will use) and W2_f8ᵀ."""

    _KEYS = ("s_act", "s_w1", "w1_f8", "s_w2", "s_w2_next", "w2_f8_t")

    def __init__(self, cfg: Fp8Config = RECORD_FP8, device: torch.device | str | None = None) -> None:
        self.cfg = cfg
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.reset()

    def reset(self) -> None:
        """Back to before the first refresh and forward (the post-warm-up restore): s_act = 1.0,
        no weights, so the next refresh must bootstrap."""
        self.s_act = torch.full((), self.cfg.act_scale_init, dtype=F32, device=self.device)
        self.s_w1: Tensor | None = None
        self.w1_f8: Tensor | None = None
        self.s_w2: Tensor | None = None
        self.s_w2_next: Tensor | None = None
        self.w2_f8_t: Tensor | None = None

    @property
    def ready(self) -> bool:
        return self.w2_f8_t is not None

    @torch.no_grad()
    def refresh(self, weights: Sequence[Tensor] | Tensor, bootstrap: bool) -> None:
        """Quantise (W1, W2) (a pair, or mlp_bank[i] of shape (2, 3072, 768)) after an optimiser
        step. W1 uses its current amax. W2 uses s_W2_next, stored by the previous refresh, unless
        bootstrapping, which uses max|W2|/448 of the current weights; either way this refresh then
        stores 1.12·max|W2|/448 for the next one."""
        w1, w2 = weights
        if not bootstrap and self.s_w2_next is None:
            raise RuntimeError("the first FP8 refresh (before training or after reset) must bootstrap")
        self.s_w1 = amax_scale(w1, 1.0, self.cfg)
        self.w1_f8 = quantize_w1(w1, self.s_w1)
        self.s_w2 = amax_scale(w2, 1.0, self.cfg) if bootstrap else self.s_w2_next
        self.w2_f8_t = quantize_w2_t(w2, self.s_w2, self.cfg)
        self.s_w2_next = amax_scale(w2, self.cfg.w2_headroom, self.cfg)

    def state_dict(self) -> dict[str, Tensor | None]:
        """The scales and quantised weights (clones): all a resumed run needs for the next forward."""
        return {k: None if getattr(self, k) is None else getattr(self, k).clone() for k in self._KEYS}

    def load_state_dict(self, state: dict[str, Tensor | None]) -> None:
        missing = set(self._KEYS) - set(state)
        if missing:
            raise KeyError(f"FP8 MLP state lacks {sorted(missing)}")
        for k in self._KEYS:
            v = state[k]
            setattr(self, k, None if v is None else v.detach().clone().to(self.device))


# ---------------------------------------------------------------- the MLP op


class _Fp8Mlp(torch.autograd.Function):
    """FP8 forward (up: current amax scales, down: delayed scales), bf16 backward. Returns the output
    and the next s_act; the caller stores the latter, so that the function has no side effect and a
    compiled step traces it whole."""

    @staticmethod
    def forward(ctx, a: Tensor, w1: Tensor, w2: Tensor, w1_f8: Tensor, s_w1: Tensor, w2_f8_t: Tensor, s_w2: Tensor,
                s_act: Tensor, cfg: Fp8Config, product: Product, backward: MlpBackward) -> tuple[Tensor, Tensor]:
        flat = a.reshape(-1, a.shape[-1])
        post, post_f8, top = mlp_up_quantized(flat, w1_f8, s_w1, s_act, cfg, product)
        out = mlp_down_quantized(post_f8, w2_f8_t, s_w2, s_act, product)
        ctx.save_for_backward(flat, w1, w2, post)
        ctx.backward = backward
        next_s_act = scale_from_amax(top, cfg.act_headroom, cfg)
        ctx.mark_non_differentiable(next_s_act)
        return out.view(*a.shape[:-1], w2.shape[1]), next_s_act

    @staticmethod
    def backward(ctx, g: Tensor, _: Tensor):
        flat, w1, w2, post = ctx.saved_tensors
        da, dw1, dw2 = ctx.backward(g.reshape(-1, g.shape[-1]), flat, w1, w2, post)
        return (da.view(*g.shape[:-1], w1.shape[1]), dw1, dw2) + (None,) * 8


def fp8_mlp(a: Tensor, w1: Tensor, w2: Tensor, state: Fp8MlpState, training: bool,
            product: Product = reference_product, backward: MlpBackward = mlp_backward_bf16) -> Tensor:
    """The record's MLP relu(a·W1ᵀ)²·W2 for the normed a (..., 768), W1 and W2 (3072, 768), all bf16.

    Training: the FP8 forward with `state`'s quantised weights (which `state.refresh` made from
    these W1, W2 after the last optimiser step), then s_act is updated from this forward's post;
    the backward bf16 (`backward`, as `mlp_backward_bf16`). Eval: `mlp_reference`, state untouched."""
    for name, t in (("a", a), ("W1", w1), ("W2", w2)):
        if t.dtype != BF16:
            raise TypeError(f"fp8_mlp takes bf16 tensors; {name} is {t.dtype}")
    if not training:
        return mlp_reference(a, w1, w2)
    if not state.ready:
        raise RuntimeError("fp8_mlp: refresh the FP8 state (bootstrap=True) before the first training forward")
    out, state.s_act = _Fp8Mlp.apply(a, w1, w2, state.w1_f8, state.s_w1, state.w2_f8_t, state.s_w2, state.s_act,
                                     state.cfg, product, backward)
    return out


# ---------------------------------------------------------------- what a training forward quantises


class Fp8Training:
    """The FP8 products of `RecordGPT`'s training forwards: the head (when `head_grad_scale` is set:
    the micro-step's 1/grad_accum, which scales the e5m2 gradient) and the MLP of each layer (when
    `mlp` holds one `Fp8MlpState` per layer of the bank). The model reads it at its `mlp` and
    `logits` seams; its eval forwards stay bf16. The trainer refreshes the MLP weights after every
    optimiser step and saves the delayed scales with a checkpoint."""

    def __init__(self, cfg: Fp8Config, head_grad_scale: float | None, mlp_layers: int,
                 device: torch.device | str | None = None) -> None:
        self.cfg, self.head_grad_scale = cfg, head_grad_scale
        self.mlp = [Fp8MlpState(cfg, device) for _ in range(mlp_layers)] if mlp_layers else None

    def reset(self) -> None:
        for state in self.mlp or ():
            state.reset()

    def refresh(self, mlp_bank: Tensor, bootstrap: bool) -> None:
        """Quantise every layer's (W1, W2) of the bank (layers, 2, hidden, width) after an update."""
        for layer, state in enumerate(self.mlp or ()):
            state.refresh(mlp_bank[layer].detach(), bootstrap)

    def state_dict(self) -> dict:
        return {"mlp": [state.state_dict() for state in self.mlp or ()]}

    def load_state_dict(self, state: dict) -> None:
        saved = state["mlp"]
        if len(saved) != len(self.mlp or ()):
            raise KeyError(f"FP8 state holds {len(saved)} MLP layers, this run has {len(self.mlp or ())}")
        for layer, s in zip(self.mlp or (), saved):
            layer.load_state_dict(s)
