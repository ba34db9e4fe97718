"""cute_fa as an attention backend of HF transformers (written against transformers 5.17).

    import cute_fa.integrations.transformers  # registers "cute_fa"
    model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16,
                                                 attn_implementation="cute_fa")
    # or, on a built model: model.set_attn_implementation("cute_fa")

Importing this module calls `register()`, which adds "cute_fa" to transformers'
`AttentionInterface` (the attention function below) and `AttentionMaskInterface`
(transformers' own `flash_attention_mask`, the one flash_attention_2 uses). A custom name
needs a mask function: without one transformers hands every layer `attention_mask=None`
and padding would be lost. With `flash_attention_mask` the attention function receives
a 2-D bool padding mask (batch, kv_len), or None when no token is padded; never a dense
4-D mask.

The mapping follows transformers' flash_attention_2 path (modeling_flash_attention_utils):
- query/key/value arrive as (batch, heads, seqlen, head_dim); cute_fa takes their
  (batch, seqlen, heads, head_dim) transposes as views, copied only where a stride breaks
  the kernels' rules. K/V keep heads_kv (GQA without repeat_kv).
- No padding: `cute_fa.forward`. Its causal mask is bottom-right aligned, which is what a
  KV-cache step (seqlen_q < seqlen_k) needs.
- A padding mask: `cute_fa.forward_varlen` on the valid tokens (the queries are the last
  seqlen_q positions of the mask, as with left padding); padded query rows come back zero.
- Packed sequences: the `cu_seq_lens_q/k` (+ `max_length_q/k`) kwargs, or the
  `position_ids` of a batch-1 input that restart from their minimum (as
  `_is_packed_sequence` / `prepare_fa_kwargs_from_position_ids` read them):
  `cute_fa.forward_varlen` with cu_seqlens [0, l1, l1+l2, ...].
- `sliding_window` w: window_size (w - 1, w - 1) when seqlen_k > w, exactly as
  flash_attention_2 (w keys including the query's own; with causal the right bound
  changes nothing, bidirectional layers get the symmetric window).
- `softcap` -> softcap (c * tanh(scores * scale / c)), `scaling` -> softmax_scale,
  `is_causal` kwarg, else `module.is_causal`, else True.
- `s_aux` (gpt-oss's attention sinks, a logit per query head) -> sinks, which train: they
  get their gradient.
- A value head_dim smaller than the query's (MLA) is zero-padded and the output cropped,
  as flash_attention_2 does.

Kwargs read: scaling, dropout, sliding_window, softcap, is_causal, cu_seq_lens_q/k,
max_length_q/k, position_ids, output_attentions, s_aux. Refused when set (they add to the
scores): `position_bias`, `head_mask`. Every other kwarg is ignored:
models pass many that do not change attention (position_embeddings, cache_position,
use_cache, layer_idx, output_hidden_states, indices, ...), so refusing unknown names would
break models.

Also refused, with a ValueError/TypeError naming the argument: dropout != 0, a mask that is
not a 2-D bool/integer padding mask (4-D or float masks say more than cute_fa can
express), returned attention weights (`output_attentions=True`), fp32 or other
non-fp16/bf16 inputs, an unsupported head_dim, chunked-attention layers (Llama4). Inputs
that need gradients train through cute_fa's backward (`cute_fa.forward` and `forward_varlen`
are differentiable), padded batches included. Like flash_attention_2, this backend never sees the mask overlays a few models
build through `or_mask_function` / `and_mask_function` / `block_sequence_ids` (e.g.
Gemma3's bidirectional image-token blocks); use "sdpa" for those.

Host syncs: the padding path syncs on `nonzero` (it sizes its output on the host; a second
one for the queries when 1 < seqlen_q < seqlen_k), then reads max_seqlen, cheap once the
stream is drained. A batch-1 prefill without a mask copies its position_ids to the host to
detect packing, once per forward: every layer gets the same tensor, and the answer is kept
for it (flash_attention_2's check syncs in every layer). `max_length_q/k` given as
tensors are read. Batched calls and decode steps without padding never sync.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import flash_attention_mask

import cute_fa

from ..runtime.run import kernel_ready
from ..layouts.config import check_head_dim

NAME = "cute_fa"

# kwargs that add to or replace the attention scores: cute_fa cannot honour them
_SCORE_KWARGS = ("position_bias", "head_mask")


def register() -> None:
    """Register "cute_fa" with transformers' attention and mask interfaces (idempotent)."""
    AttentionInterface.register(NAME, cute_fa_attention)
    AttentionMaskInterface.register(NAME, flash_attention_mask)


# layers already found to be of a kind cute_fa computes (their type never changes): the
# config lookups that tell, slow in transformers' config classes, run once per layer
_plain_layers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _check_layer(module: torch.nn.Module, config) -> None:
    layer_types = getattr(config, "layer_types", None)
    layer_idx = getattr(module, "layer_idx", None)
    if layer_types and isinstance(layer_idx, int) and layer_idx < len(layer_types) \
            and layer_types[layer_idx] == "chunked_attention":
        raise ValueError(f"cute_fa attention cannot express chunked attention (layer {layer_idx} "
                         f"of config.layer_types); use attn_implementation='sdpa'")


def _check_call(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, attention_mask, dropout: float, kwargs: dict) -> None:
    if dropout:
        raise ValueError(f"cute_fa attention has no dropout, got dropout={dropout} (the model's "
                         f"attention_dropout in training mode); set config.attention_dropout=0.0 "
                         f"or call model.eval()")
    config = getattr(module, "config", None)
    output_attentions = kwargs.get("output_attentions")
    if output_attentions is None:
        output_attentions = getattr(config, "output_attentions", False)
    if output_attentions:
        raise ValueError("cute_fa attention does not return attention weights "
                         "(output_attentions=True); use attn_implementation='eager'")
    for name in _SCORE_KWARGS:
        if kwargs.get(name) is not None:
            raise ValueError(f"cute_fa attention cannot apply {name!r} to the scores; "
                             f"use attn_implementation='eager' or 'sdpa' for this model")
    try:
        checked = module in _plain_layers
    except TypeError:  # not an nn.Module (no weak references): checked every call
        checked = False
    if not checked:
        _check_layer(module, config)
        if isinstance(module, torch.nn.Module):
            _plain_layers[module] = True
    if attention_mask is not None and kwargs.get("cu_seq_lens_q") is not None:
        raise ValueError("cute_fa attention got both cu_seq_lens_q/k (packed sequences) and a "
                         "padding attention_mask; pass one of them")
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2 or \
                attention_mask.is_floating_point() or attention_mask.is_complex():
            what = (f"a {attention_mask.dim()}-D {attention_mask.dtype} tensor"
                    if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__)
            raise ValueError(f"cute_fa attention takes attention_mask as None or a 2-D bool/int "
                             f"padding mask (batch, seqlen_k), got {what}: an arbitrary mask "
                             f"cannot be expressed by the kernels")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"cute_fa attention takes float16 or bfloat16 {name}, got {t.dtype}; "
                            f"load the model with dtype=torch.bfloat16")
    check_head_dim("head_dim (query.shape[-1])", query.shape[-1])
    if value.shape[-1] > query.shape[-1]:
        raise ValueError(f"cute_fa attention needs value's head_dim ({value.shape[-1]}) at most "
                         f"query's ({query.shape[-1]})")


# the last position_ids tensor checked for packing and the answer: every layer of one forward
# gets the same tensor, so the host copy the check needs happens once per forward, not per layer
_last_packing: list = [None, None]


def _packed_from_position_ids(position_ids: torch.Tensor | None, query: torch.Tensor,
                              key: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """(cu_seqlens, max_seqlen) where `position_ids` pack several sequences into a batch-1
    input (each sequence restarting at the minimum position), else None.
    Only a batch-1 call with seqlen_q == seqlen_k > 1 can be packed, so decode steps and
    batched calls skip the host copy this check needs."""
    seqlen = query.shape[2]
    if position_ids is None or query.shape[0] != 1 or seqlen == 1 or key.shape[2] != seqlen \
            or position_ids.numel() != seqlen:
        return None
    held, answer = _last_packing
    if held is not None and held() is position_ids and \
            (answer is None or answer[0].device == query.device):
        return answer
    answer = _packing_of(position_ids, seqlen, query.device)
    _last_packing[:] = [weakref.ref(position_ids), answer]
    return answer


def _packing_of(position_ids: torch.Tensor, seqlen: int,
                device: torch.device) -> tuple[torch.Tensor, int] | None:
    positions = position_ids.reshape(-1).cpu()
    starts = (positions == positions.min()).nonzero().flatten()
    if len(starts) < 2 or starts[0] != 0:
        return None
    cu_seqlens = torch.cat([starts, torch.tensor([seqlen])]).to(torch.int32)
    return cu_seqlens.to(device), int(cu_seqlens.diff().max())


def _packing(kwargs: dict, query: torch.Tensor,
             key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int, int] | None:
    """(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) of packed sequences, from
    the `cu_seq_lens_q/k` (+ `max_length_q/k`) kwargs or from `position_ids`, else None."""
    cu_seqlens_q, cu_seqlens_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("cute_fa attention needs cu_seq_lens_q and cu_seq_lens_k together")
    if cu_seqlens_q is None:
        found = _packed_from_position_ids(kwargs.get("position_ids"), query, key)
        return None if found is None else (found[0], found[0], found[1], found[1])
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    return (cu_seqlens_q.to(torch.int32), cu_seqlens_k.to(torch.int32),
            int(max_q if max_q is not None else cu_seqlens_q.diff().max()),
            int(max_k if max_k is not None else cu_seqlens_k.diff().max()))


def _padded_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                   flash_kwargs: dict) -> torch.Tensor:
    """Attention of the valid tokens of a padded batch; q, k, v (batch, seqlen, heads, d).
    The queries are the last seqlen_q positions of `mask`, as with left padding."""
    batch, seqlen_q = q.shape[:2]
    mask = mask.bool()
    # Keys past the mask's length (a static cache's unwritten slots) are never gathered.
    if not seqlen_q <= mask.shape[1] <= k.shape[1]:
        raise ValueError(f"attention_mask must cover from seqlen_q ({seqlen_q}) to seqlen_k "
                         f"({k.shape[1]}) positions, got shape {tuple(mask.shape)}")
    lengths_k = mask.sum(dim=-1, dtype=torch.int32)
    cu_seqlens_k = F.pad(lengths_k.cumsum(0, dtype=torch.int32), (1, 0))
    rows_k, cols_k = mask.nonzero(as_tuple=True)  # the host sync: nonzero sizes its output
    max_seqlen_k = int(lengths_k.max())
    k, v = k[rows_k, cols_k], v[rows_k, cols_k]
    if seqlen_q == mask.shape[1]:
        rows_q, cols_q = rows_k, cols_k
        cu_seqlens_q, max_seqlen_q = cu_seqlens_k, max_seqlen_k
    elif seqlen_q == 1:  # a decode step: every sequence has its one query
        rows_q = torch.arange(batch, device=q.device)
        cols_q = torch.zeros_like(rows_q)
        cu_seqlens_q = torch.arange(batch + 1, device=q.device, dtype=torch.int32)
        max_seqlen_q = 1
    else:
        mask_q = mask[:, -seqlen_q:]
        lengths_q = mask_q.sum(dim=-1, dtype=torch.int32)
        cu_seqlens_q = F.pad(lengths_q.cumsum(0, dtype=torch.int32), (1, 0))
        rows_q, cols_q = mask_q.nonzero(as_tuple=True)
        max_seqlen_q = int(lengths_q.max())
    out_valid = cute_fa.forward_varlen(
        kernel_ready(q[rows_q, cols_q]), kernel_ready(k), kernel_ready(v),
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **flash_kwargs)
    out = q.new_zeros(q.shape)
    out[rows_q, cols_q] = out_valid
    return out


def cute_fa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None,
                      scaling: float | None = None, dropout: float = 0.0,
                      sliding_window: int | None = None, softcap: float | None = None,
                      is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query (batch, heads_q, seqlen_q, d),
    key/value (batch, heads_kv, seqlen_k, d); returns ((batch, seqlen_q, heads_q, d), None)."""
    _check_call(module, query, key, value, attention_mask, dropout, kwargs)
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    flash_kwargs = dict(causal=bool(is_causal),
                        softmax_scale=None if scaling is None else float(scaling))
    # Window and softcap are passed only when they act: cute_fa's defaults keep its fast
    # argument check. The window is flash_attention_2's mapping: HF's window counts the
    # query's own key, flash-attn's bounds do not; the right bound is moot under causal
    # and makes the window symmetric for bidirectional layers.
    if sliding_window is not None and key.shape[2] > sliding_window:
        flash_kwargs["window_size"] = (sliding_window - 1, sliding_window - 1)
    if softcap:
        flash_kwargs["softcap"] = float(softcap)
    if kwargs.get("s_aux") is not None:
        flash_kwargs["sinks"] = kwargs["s_aux"]

    head_dim, v_head_dim = query.shape[-1], value.shape[-1]
    if v_head_dim != head_dim:
        value = F.pad(value, (0, head_dim - v_head_dim))
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    batch, seqlen_q = q.shape[:2]

    if attention_mask is not None:
        out = _padded_varlen(q, k, v, attention_mask, flash_kwargs)
    elif (packed := _packing(kwargs, query, key)) is not None:
        out = cute_fa.forward_varlen(
            kernel_ready(q.reshape(-1, *q.shape[2:])), kernel_ready(k.reshape(-1, *k.shape[2:])),
            kernel_ready(v.reshape(-1, *v.shape[2:])), *packed, **flash_kwargs)
        out = out.view(batch, seqlen_q, *out.shape[1:])
    else:
        out = cute_fa.forward(kernel_ready(q), kernel_ready(k), kernel_ready(v),
                              **flash_kwargs)
    if v_head_dim != head_dim:
        out = out[..., :v_head_dim]
    return out, None


register()
