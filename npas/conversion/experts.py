"""Expert pools from a dense model's MLPs: split the units of the layers that read a pool (MoEfication).

A pool of E experts of width m read by layers R is filled from those layers' dense MLPs: their units
ranked by importance (|up row| x |down column|), expert e takes the next m units of layer R[e % |R|]
(wrapping when a layer has fewer units than its experts need), so the pool starts out holding the
dense MLPs' most useful units spread across its experts. Each router row starts at the normalised
centroid of its expert's up-projection rows: a token whose hidden state points where an expert's units
fire is routed to it, instead of by a fresh random router. Down-projections are scaled by E / k:
a fresh router gives each of the k selected experts a weight near 1/E, so their sum starts at about
the strength of k chunks of the dense MLP.
"""

from __future__ import annotations

import torch
from torch import Tensor

from npas.allocation.config import ArchConfig


def unit_order(up: Tensor, down: Tensor) -> Tensor:
    """Units of one dense MLP (up: (n, d), down: (d, n)) by decreasing importance."""
    return torch.argsort(up.norm(dim=1) * down.norm(dim=0), descending=True)


@torch.no_grad()
def split_experts(cfg: ArchConfig, pools: torch.nn.Module, dense: list[dict[str, Tensor]],
                  router_std: float = 0.02) -> dict[int, list[int]]:
    """Fill ``pools`` (an ``ExpertPools``) from per-layer dense MLP weights ``dense[i]`` (slots mlp_up,
    mlp_down, and mlp_gate when gated, as (out, in) matrices). Returns pool -> layers it read."""
    e = cfg.experts
    m, k = e.d_expert, e.top_k
    readers = {p: [i for i, q in enumerate(e.pool_of_layer) if q == p] for p in range(len(e.pool_sizes))}
    centroids: dict[int, Tensor] = {}
    for p, bank in enumerate(pools.pools):
        layers = readers[p]
        orders = {i: unit_order(dense[i]["mlp_up"], dense[i]["mlp_down"]) for i in layers}
        n_experts = e.pool_sizes[p]
        rows = []
        for x in range(n_experts):
            i, chunk = layers[x % len(layers)], x // len(layers)
            order = orders[i]
            units = order[(chunk * m + torch.arange(m)) % len(order)]
            bank.up[x].copy_(dense[i]["mlp_up"][units].T)
            if getattr(bank, "gate", None) is not None:
                bank.gate[x].copy_(dense[i]["mlp_gate"][units].T)
            bank.down[x].copy_(dense[i]["mlp_down"][:, units].T * (n_experts / k))
            c = dense[i]["mlp_up"][units].mean(0)
            rows.append(c / c.norm().clamp_min(1e-12))
        centroids[p] = torch.stack(rows)
    d = cfg.chassis.d_model
    for r, router in enumerate(pools.routers):
        p = r if e.router == "shared" else e.pool_of_layer[r]
        router.copy_(centroids[p] * router_std * d**0.5)  # each row's norm as a random row of that std
    return readers
