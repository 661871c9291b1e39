"""lm-evaluation-harness adapter: an `lm_eval` LM over a scalelab model or checkpoint.

    from scalelab.train.eval_harness import ScalelabLM
    lm = ScalelabLM.from_checkpoint("runs/r1/checkpoints/step_400")
    import lm_eval
    lm_eval.simple_evaluate(model=lm, tasks=["arc_easy"])            # any lm-eval task
    # or from the lm-eval CLI once this module is imported: --model scalelab
    #    --model_args checkpoint=runs/r1/checkpoints/step_400,device=cpu

lm-eval is an optional extra (`pip install lm-eval`); without it this module still imports and the
class works on any request objects with an `.args` tuple (what lm-eval's `Instance` carries), so
scalelab's own evaluators and tests can use it directly.

Methods (lm-eval's contract):
  loglikelihood([(context, continuation)]) -> [(sum log p(continuation | context), is_greedy)]
  loglikelihood_rolling([(text,)]) -> [sum log p(text)], every token predicted exactly once,
      conditioned on end-of-text and as much preceding text as fits in max_seq_len
  generate_until([(context, {"until": [...], "max_gen_toks": n})]) -> [greedy continuation,
      cut at the first stop string]; sampling is not supported (greedy only).
Scoring shares `continuation_logprobs` with scalelab's multiple-choice evaluator, so the two agree
to the last digit on the same requests.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch

from scalelab.errors import UsageError
from scalelab.train.data.tokenizer import load_tokenizer
from scalelab.train.eval_checkpoint import find_checkpoints, load_checkpoint_model
from scalelab.train.eval_tasks import continuation_logprobs, encode_pair

try:  # optional extra
    from lm_eval.api.model import LM as _LMBase
    from lm_eval.api.registry import register_model as _register

    HAVE_LM_EVAL = True
except ImportError:  # pragma: no cover - exercised on machines without lm-eval
    _LMBase = object
    HAVE_LM_EVAL = False

    def _register(*_names):
        return lambda cls: cls


def _args(request) -> tuple:
    return tuple(request.args) if hasattr(request, "args") else tuple(request)


@_register("scalelab")
class ScalelabLM(_LMBase):
    """lm-eval LM over a scalelab Transformer (or any `model(tokens) -> logits` module)."""

    def __init__(
        self,
        model=None,
        tokenizer=None,
        *,
        max_seq_len: int | None = None,
        batch_sequences: int = 16,
        max_gen_tokens: int = 128,
        checkpoint: str | None = None,
        device: str = "cpu",
    ) -> None:
        if HAVE_LM_EVAL:
            super().__init__()
        if checkpoint is not None:
            model, cfg, _ = load_checkpoint_model(_as_path(checkpoint), device)
            tokenizer = load_tokenizer(cfg.data.tokenizer)
            max_seq_len = max_seq_len or cfg.model.max_seq_len
        if model is None or tokenizer is None:
            raise UsageError("ScalelabLM needs model= and tokenizer=, or checkpoint=PATH")
        self.model = model
        self.tokenizer = tokenizer
        self.max_seq_len = int(max_seq_len or model.cfg.max_seq_len)
        self.batch_sequences = int(batch_sequences)
        self.max_gen_tokens = int(max_gen_tokens)

    @classmethod
    def from_checkpoint(cls, checkpoint: str | os.PathLike, device: str = "cpu", **kwargs) -> ScalelabLM:
        return cls(checkpoint=str(checkpoint), device=device, **kwargs)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> ScalelabLM:
        """lm-eval CLI entry: "checkpoint=PATH,device=cpu,batch_sequences=16"."""
        kwargs = {}
        for part in filter(None, arg_string.split(",")):
            key, _, value = part.partition("=")
            kwargs[key.strip()] = value.strip()
        for key in ("batch_sequences", "max_gen_tokens", "max_seq_len"):
            if key in kwargs:
                kwargs[key] = int(kwargs[key])
        if additional_config and additional_config.get("device"):
            kwargs.setdefault("device", additional_config["device"])
        return cls(**kwargs)

    # --- lm-eval interface ----------------------------------------------------------------------
    def loglikelihood(self, requests: Sequence) -> list[tuple[float, bool]]:
        pairs = [encode_pair(self.tokenizer, *_args(r)[:2]) for r in requests]
        return continuation_logprobs(
            self.model,
            pairs,
            eot_id=self.tokenizer.eot_id,
            max_seq_len=self.max_seq_len,
            batch_sequences=self.batch_sequences,
        )

    def loglikelihood_rolling(self, requests: Sequence) -> list[float]:
        out = []
        for r in requests:
            ids = self.tokenizer.encode(_args(r)[0])
            if not ids:
                out.append(0.0)
                continue
            # chunk k predicts ids[s:e]; continuation_logprobs gives it [eot] + ids[:s] truncated
            # from the left to max_seq_len inputs, i.e. the fullest context that fits.
            chunks = [(ids[:s], ids[s : s + self.max_seq_len]) for s in range(0, len(ids), self.max_seq_len)]
            scores = continuation_logprobs(
                self.model,
                chunks,
                eot_id=self.tokenizer.eot_id,
                max_seq_len=self.max_seq_len,
                batch_sequences=self.batch_sequences,
            )
            out.append(float(sum(lp for lp, _ in scores)))
        return out

    @torch.no_grad()
    def generate_until(self, requests: Sequence) -> list[str]:
        out = []
        for r in requests:
            context, gen_kwargs = _args(r)[:2]
            gen_kwargs = dict(gen_kwargs or {})
            if gen_kwargs.get("do_sample"):
                raise UsageError("ScalelabLM.generate_until is greedy only; set do_sample=False")
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(gen_kwargs.get("max_gen_toks", self.max_gen_tokens))
            out.append(self._greedy(context, until, max_new))
        return out

    def _greedy(self, context: str, until: list[str], max_new: int) -> str:
        device = next(self.model.parameters()).device
        ids = [self.tokenizer.eot_id, *self.tokenizer.encode(context)]
        new: list[int] = []
        was_training = self.model.training
        self.model.eval()
        text = ""
        for _ in range(max_new):
            window = (ids + new)[-self.max_seq_len :]
            logits = self.model(torch.tensor([window], device=device))[0, -1]
            nxt = int(logits.argmax())
            if nxt == self.tokenizer.eot_id:
                break
            new.append(nxt)
            text = self.tokenizer.decode(new)
            if any(s in text for s in until):
                break
        if was_training:
            self.model.train()
        cut = min((text.find(s) for s in until if s in text), default=len(text))
        return text[:cut]


def _as_path(checkpoint: str):
    _, ckpts = find_checkpoints(checkpoint)
    return ckpts[-1] if not (Path(checkpoint) / "train_state.json").exists() else Path(checkpoint)
