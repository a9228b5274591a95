"""Expert dispatch against a per-token reference: a pool shared by every layer, sorted-token dispatch
(grouped matmul and the per-expert loop) held to the plain per-token computation, outputs and
gradients, for k = 1 and 2, with experts that receive no tokens."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from npas.allocation import experts as experts_mod
from npas.allocation.config import ExpertPool
from npas.allocation.experts import ExpertPools

D, WIDTH, LAYERS = 8, 6, 3


@pytest.fixture(params=["grouped_mm", "loop"])
def dispatch(request, monkeypatch):
    """Both forward paths: F.grouped_mm, and the per-expert loop used where it is unavailable."""
    monkeypatch.setattr(experts_mod, "GROUPED_MM", {} if request.param == "grouped_mm" else {"cpu": False})
    return request.param


def pools(n: int, k: int, gated: bool, router: str = "per_layer") -> ExpertPools:
    torch.manual_seed(0)
    return ExpertPools(ExpertPool((n,), (0,) * LAYERS, WIDTH, k, router), D, gated, 0.3, 0.3)


def run(model: ExpertPools, x: torch.Tensor) -> torch.Tensor:
    """Every layer reads the one pool, each on the previous one's output (a residual stack)."""
    model.reset()
    h = x
    for layer in range(LAYERS):
        h = h + model(h.view(1, -1, D), layer).view(-1, D)
    return h


def reference(model: ExpertPools, x: torch.Tensor) -> torch.Tensor:
    """The same stack computed token by token: each token's k best experts by router probability,
    weighted by it, from the bank's own per-expert formula."""
    bank = model.pools[0]
    h = x
    for layer in range(LAYERS):
        probs = F.linear(h, model.router_of(layer)).float().softmax(-1)
        gate, idx = probs.topk(model.top_k, dim=-1)
        rows = [sum(gate[t, j] * bank.expert(int(idx[t, j]), h[t:t + 1])[0] for j in range(model.top_k))
                for t in range(h.shape[0])]
        h = h + torch.stack(rows)
    return h


def grads(model: ExpertPools, x: torch.Tensor, forward) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    out = forward(model, x)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    named = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), {**named, "input": x.grad.clone()}


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("gated", [False, True])
def test_dispatch_equals_the_per_token_reference(dispatch, k, gated):
    model = pools(24, k, gated)
    # 4 tokens x k experts x 3 layers < 24 experts: some get none
    x = torch.randn(4, D, generator=torch.Generator().manual_seed(1))
    out, got = grads(model, x, run)
    want_out, want = grads(model, x, reference)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-6)
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=name)
    idle = got["pools.0.up"].flatten(1).abs().sum(1) == 0
    assert idle.any() and not idle.all(), "the case must include experts with and without tokens"
    for name in ("pools.0.up", "pools.0.down") + (("pools.0.gate",) if gated else ()):
        assert (got[name].flatten(1).abs().sum(1) == 0).tolist() == idle.tolist(), name
