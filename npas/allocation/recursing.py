"""The forward of per-token recursion depth: route, gather the active tokens, run the stack, scatter back.

`Recursion` holds the router (steps x d_model) and runs the middle of the model (the stack's passes)
for `TransformerLM`, which hands it a function running one depth position on a (B, n, d) slice. At
each step the tokens still active are gathered into a shorter sequence (their positions in ascending
order, so plain causal attention over the slice is causal over the original sequence), the step's U
layers run on that slice only, and the results are scattered back: a token routed out costs no FLOPs
at later steps, which a mask over full-size tensors would not save.

Two rules decide who is active (`npas.allocation.recursion`): the training rule (expert-choice top-k
over each sequence, the paper's; not causal) and the causal rule (each token's own score against a
threshold tracked on training windows). `rule` picks one; None = training rule while the module
trains, causal rule in evaluation, so every loss npas reports and every sampled token use the causal
rule unless a caller asks for the training rule on purpose (to report the gap between them). Under
the causal rule rows keep different numbers of tokens: the slice is padded to the longest row, the
padding is masked out as keys and never written back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from npas.allocation.experts import PerForward
from npas.allocation.recursion import RecursionSpec

Rule = Literal["train", "causal"]
# run(layer, x (B, n, d), rope of the slice or None, attention mask arguments or None) -> x
StepLayer = Callable[[int, Tensor, Any, Any], Tensor]
THRESHOLD_RATE = 0.05  # the threshold's moving average: a running mean for the first 20 updates, then EMA


class Recursion(nn.Module):
    """The router of a recursion spec and the pass loop over its shared stack."""

    def __init__(self, spec: RecursionSpec, d_model: int, std: float) -> None:
        super().__init__()
        self.spec = spec
        self.router = nn.Parameter(torch.empty(spec.steps, d_model).normal_(0.0, std))
        # expert_choice: the causal rule's score threshold per step, tracked on the training windows
        self.register_buffer("threshold", torch.zeros(spec.steps))
        self.register_buffer("updates", torch.zeros(spec.steps))
        self.rule: Rule | None = None
        self._last = PerForward()  # [weighted router loss, (steps,) share of tokens active per step]

    def active_rule(self) -> Rule:
        return self.rule or ("train" if self.training else "causal")

    @property
    def aux_loss(self) -> Tensor:
        return self._last[0] if self._last else torch.zeros(())

    @property
    def active_share(self) -> Tensor | None:
        """(steps,) share of the last forward's tokens that ran each step (None before any forward)."""
        return self._last[1].detach() if self._last else None

    def forward(self, h: Tensor, run: StepLayer, rope_at: Callable[[Tensor | None], Any]) -> Tensor:
        """The hidden states after the stack's passes. `rope_at(positions)` gives the rotary tables of
        a slice's (B, n) positions (None: the whole sequence; returns None on a classic chassis)."""
        spec = self.spec
        B, T, d = h.shape
        rule = self.active_rule()
        pos = torch.arange(T, device=h.device)
        active: Tensor | None = None  # (B, T) bool; None = every token
        losses: list[Tensor] = []
        shares: list[Tensor] = []
        gate_tc = choice = None
        if spec.router == "token_choice":
            logits = F.linear(h, self.router).float()  # (B, T, steps)
            probs = logits.softmax(-1)
            gate_tc, choice = probs.max(-1)  # a token runs steps 0..choice
            counts = torch.bincount(choice.reshape(-1), minlength=spec.steps).to(probs.dtype)
            balance = spec.steps * torch.sum(counts / choice.numel() * probs.reshape(-1, spec.steps).mean(0))
            z = torch.logsumexp(logits, -1).pow(2).mean()
            losses.append(spec.balance_weight * balance + spec.z_weight * z)
        for r in range(spec.steps):
            gate = None
            if spec.router == "token_choice":
                if r > 0:
                    active = choice >= r
                gate = gate_tc if spec.gate == "sigmoid" else None
            else:
                routed = spec.capacity(r) < (spec.capacity(r - 1) if r else 1.0)
                if routed or spec.gate == "sigmoid":  # a score nobody reads is not computed
                    score = F.linear(h, self.router[r:r + 1]).squeeze(-1).float()  # (B, T)
                if routed:
                    active, loss = self._route(r, score, active, rule, T)
                    if loss is not None:
                        losses.append(spec.aux_weight * loss)
                gate = torch.sigmoid(score) if spec.gate == "sigmoid" else None
            shares.append(torch.ones((), device=h.device) if active is None else active.float().mean())
            # expert-choice's training rule keeps the same number of tokens in every row, known without a
            # host sync; token-choice's rows keep what their tokens chose
            kept = T if active is None else max(1, round(spec.capacity(r) * T)) \
                if rule == "train" and spec.router == "expert_choice" else None
            h = self._step(r, h, active, kept, gate, pos, run, rope_at)
        self._last = PerForward([torch.stack(losses).sum() if losses else torch.zeros((), device=h.device),
                                 torch.stack(shares).detach()])
        return h

    def _route(self, r: int, score: Tensor, active: Tensor | None, rule: Rule,
               T: int) -> tuple[Tensor, Tensor | None]:
        """Who runs step r: the top-k of each sequence's candidates (training rule: k = capacity x T),
        or every candidate whose score clears the threshold (causal rule). Also the BCE loss that
        teaches the scores the top-k's choice, and the threshold's update (training rule)."""
        cand = torch.ones_like(score, dtype=torch.bool) if active is None else active
        if rule == "causal":
            return cand & (score > self.threshold[r]), None
        k = max(1, round(self.spec.capacity(r) * T))
        n_cand = max(1, round(self.spec.capacity(r - 1) * T)) if r else T  # what the last routed step kept
        if k >= n_cand:
            return cand, None
        masked = score.masked_fill(~cand, float("-inf"))
        top = masked.topk(k + 1, dim=-1)
        chosen = torch.zeros_like(cand).scatter_(1, top.indices[:, :k], True)
        loss = F.binary_cross_entropy_with_logits(score[cand], chosen[cand].float())
        if self.training:
            with torch.no_grad():  # the boundary between kept and dropped, averaged over the batch
                boundary = top.values[:, k - 1:k + 1].mean()
                rate = max(THRESHOLD_RATE, 1.0 / (float(self.updates[r]) + 1.0))
                self.threshold[r] += rate * (boundary - self.threshold[r])
                self.updates[r] += 1
        return chosen, loss

    def _step(self, r: int, h: Tensor, active: Tensor | None, kept: int | None, gate: Tensor | None,
              pos: Tensor, run: StepLayer, rope_at: Callable[[Tensor | None], Any]) -> Tensor:
        """Step r's U layers over the active tokens only, their results scattered back into h. `kept`:
        the tokens every row keeps when known (the training rule), None when rows differ (causal rule)."""
        spec = self.spec
        B, T, d = h.shape
        layers = [spec.first + r * spec.stack + j for j in range(spec.stack)]
        shared = spec.kv == "shared_first" and r > 0  # keys/values of every token, from step 0
        if kept is None:
            counts = active.sum(-1)
            n = int(counts.max())
            valid = None if bool((counts == n).all()) else torch.arange(n, device=h.device)[None, :] < counts[:, None]
        else:
            n, valid = kept, None
        if active is None or (n == T and valid is None):
            x = h
            for i in layers:
                x = run(i, x, rope_at(None), None)
            return x if gate is None else h + gate.unsqueeze(-1).to(h.dtype) * (x - h)
        if n == 0:
            return h
        # active positions first, in ascending order; rows with fewer are padded with inactive ones
        idx = torch.where(active, pos, pos + T).argsort(-1)[:, :n]  # (B, n)
        qpos = idx  # the original positions of the slice's tokens
        if shared:  # queries of the slice over step 0's keys of the whole sequence
            attn: dict[str, Tensor] | None = {"attn_mask": (pos[None, None, :] <= qpos[:, :, None])[:, None]}
        elif valid is None:
            attn = None  # the slice is in causal order: plain causal attention
        else:
            causal = qpos[:, None, :] <= qpos[:, :, None]  # (B, n_q, n_k)
            own = torch.eye(n, dtype=torch.bool, device=h.device)[None]
            attn = {"attn_mask": (causal & valid[:, None, :] | own)[:, None]}
        gather = idx.unsqueeze(-1).expand(-1, -1, d)
        x0 = h.gather(1, gather)
        x = x0
        rope = rope_at(qpos)
        for i in layers:
            x = run(i, x, rope, attn)
        if gate is not None:
            x = x0 + gate.gather(1, idx).unsqueeze(-1).to(h.dtype) * (x - x0)
        if valid is not None:
            x = torch.where(valid.unsqueeze(-1), x, x0)  # padding slots write back what they read
        return h.scatter(1, gather, x)
