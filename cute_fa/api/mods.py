"""`score_mod`, `mask_mod` and `sinks` at the public functions. The mods are traced at the call
(`cute_fa.mods.trace`; an operation outside the vocabulary raises a TypeError naming it), the
graphs put into the call's score features (the kernel key's fields: a new function compiles,
new values in the same tensors do not) and the tensors they index handed to the launch; the
sink logits are checked and handed over as float32."""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from ..runtime.call import AttentionCall


class TracedMods(NamedTuple):
    """A call's traced mods (None: not given) and the tensors they capture, the score_mod's
    first (in slot order); its sink logits, float32 (heads_q,) (None: no sinks)."""

    score_mod: object = None
    mask_mod: object = None
    captures: tuple = ()
    sinks: object = None

    def __bool__(self) -> bool:
        return self.score_mod is not None or self.mask_mod is not None \
            or self.sinks is not None


NONE = TracedMods()


def trace_mods(score_mod: Callable | None, mask_mod: Callable | None, q: torch.Tensor,
               softcap: float = 0.0, sinks: torch.Tensor | None = None,
               heads_q: int = 0) -> TracedMods:
    """The call's mods traced and checked against it: callables, not with a softcap next to a
    score_mod, their captured tensors on q's device; sinks a float tensor (heads_q,) there."""
    if score_mod is None and mask_mod is None:
        return NONE if sinks is None else TracedMods(sinks=_sinks(sinks, q, heads_q))
    from ..mods.trace import trace_mask_mod, trace_score_mod

    traced = []
    for name, fn, tracer in (("score_mod", score_mod, trace_score_mod),
                             ("mask_mod", mask_mod, trace_mask_mod)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be a function {_SIGNATURES[name]} or None, "
                            f"got {type(fn).__name__}")
        traced.append(tracer(fn) if fn is not None else (None, ()))
    if score_mod is not None and softcap:
        raise ValueError("softcap and score_mod together: write the softcap into the score_mod "
                         "(softcap * torch.tanh(score / softcap)) or give one of them")
    (score_graph, score_captures), (mask_graph, mask_captures) = traced
    for name, tensors in (("score_mod", score_captures), ("mask_mod", mask_captures)):
        for t in tensors:
            if t.device != q.device:
                raise ValueError(f"{name} indexes a tensor on {t.device}: the tensors a mod "
                                 f"captures must be on q's device, {q.device}")
    return TracedMods(score_graph, mask_graph, score_captures + mask_captures,
                      None if sinks is None else _sinks(sinks, q, heads_q))


def _sinks(sinks, q: torch.Tensor, heads_q: int) -> torch.Tensor:
    """The sink logits as the kernels read them: float32, contiguous, one per query head."""
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks must be a tensor of one logit per query head, shape "
                        f"({heads_q},), or None, got {type(sinks).__name__}")
    if sinks.shape != (heads_q,) or not sinks.is_floating_point():
        raise ValueError(f"sinks must be a float tensor of shape (heads_q,) = ({heads_q},), "
                         f"got {sinks.dtype} {tuple(sinks.shape)}")
    if sinks.device != q.device:
        raise ValueError(f"sinks must be on q's device, {q.device}, got {sinks.device}")
    if sinks.requires_grad and torch.is_grad_enabled():  # its gradient would be lost
        raise ValueError("sinks have no backward yet: call under torch.no_grad() or with sinks "
                         "that do not require grad")
    return sinks.detach().to(torch.float32).contiguous()


_SIGNATURES = {"score_mod": "(score, b, h, q_idx, kv_idx) -> score",
               "mask_mod": "(b, h, q_idx, kv_idx) -> bool"}


def with_mods(call: AttentionCall, mods: TracedMods) -> AttentionCall:
    """The checked call with its mods among its score features."""
    if not mods:
        return call
    return call._replace(features=call.features._replace(
        score_mod=mods.score_mod, mask_mod=mods.mask_mod, sinks=mods.sinks is not None))


def refuse_without_backward(mods: TracedMods) -> None:
    """Mods and sinks have no backward yet: a call autograd must record raises."""
    if mods:
        raise ValueError("score_mod, mask_mod and sinks have no backward yet: call under "
                         "torch.no_grad() or with q, k, v (and sinks) that do not require grad")


def refuse_under_compile(mods: TracedMods) -> None:
    if mods:
        raise ValueError("score_mod, mask_mod and sinks do not run under torch.compile yet: "
                         "call the function eagerly (torch.compiler.disable)")
