"""Expert pools shared across layers (UniPool / MoEUT / WideNet): the MLP as a sparse mixture.

Each pool stores P experts, small MLPs of width `d_expert`, stacked in one tensor per matrix so a
pool is three (or two) Parameters however many experts it holds. Every layer reads one pool through
its own router (or its pool's shared router): a token's k best experts run, weighted by their router
probabilities, and nothing else is computed. Dispatch sorts the (token, expert) assignments by
expert and runs each matrix as one grouped matmul over the experts' contiguous segments
(`F.grouped_mm`: a segment of n tokens costs n rows, an expert with no tokens costs nothing), then
adds the results back with one `index_add_`. So a step costs k experts per token whatever the pool
size, and the number of kernels does not grow with the pool either. Where grouped_mm is missing for
a device or dtype, a loop over the experts that received tokens computes the same thing.

The load-balancing loss is Switch Transformer's, taken over a whole pool: with f_e the share of the
pool's (token, slot) assignments that went to expert e and p_e the mean router probability of e,
both over every layer that reads the pool, loss = P * sum_e f_e p_e (1 when perfectly balanced).
A pool shared by many layers is balanced as one resource, which is what keeps all of its experts
trained. The model exposes the weighted mean over pools as `aux_loss` after each forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from npas.allocation.config import ExpertPool


class PerForward(list):
    """State of the last forward pass (routing statistics, the balance loss), still attached to its
    autograd graph. A copy of the model -- a cooldown fork (``npas.training.forks``) deep-copies the
    model between steps -- starts without it: the next forward rebuilds it, and a graph-attached
    tensor cannot be deep-copied at all (torch refuses non-leaf tensors), which made every WSD run of
    an allocation with expert pools fail at its first fork."""

    def __deepcopy__(self, memo: dict) -> PerForward:
        return type(self)()

# device type -> whether F.grouped_mm ran there; set on first use, a failure falls back to the loop
GROUPED_MM: dict[str, bool] = {}


def grouped_matmul(x: Tensor, w: Tensor, offs: Tensor) -> Tensor:
    """Rows offs[e-1]:offs[e] of x (n, d_in) times w[e] (P, d_in, d_out), for every expert e."""
    dev = x.device.type
    if dev != "cpu" and torch.is_autocast_enabled(dev):  # what F.linear would compute in under autocast
        x = x.to(torch.get_autocast_dtype(dev))
    if GROUPED_MM.get(dev, True):
        try:
            out = F.grouped_mm(x, w.to(x.dtype), offs=offs)
            GROUPED_MM[dev] = True
            return out
        except torch.cuda.OutOfMemoryError:
            raise  # the run is too large, not the kernel missing: the proxy records it as failed
        except (RuntimeError, NotImplementedError):
            GROUPED_MM[dev] = False
    # unbind once: its backward stacks the experts' gradients in one tensor, where indexing w[e]
    # per expert would allocate a zero gradient of the whole pool for every expert
    ws = w.unbind(0)
    ends = offs.tolist()
    starts = [0, *ends[:-1]]
    return torch.cat([x[s:e] @ ws[i].to(x.dtype) for i, (s, e) in enumerate(zip(starts, ends, strict=True)) if e > s])


class ExpertBank(nn.Module):
    """One pool: `up` (and `gate`) (P, d, w), `down` (P, w, d); expert e is row e of each."""

    def __init__(self, n: int, d_model: int, width: int, gated: bool, std: float, resid_std: float) -> None:
        super().__init__()
        self.up = nn.Parameter(torch.empty(n, d_model, width).normal_(0.0, std))
        if gated:
            self.gate = nn.Parameter(torch.empty(n, d_model, width).normal_(0.0, std))
        self.down = nn.Parameter(torch.empty(n, width, d_model).normal_(0.0, resid_std))
        self.gated = gated

    def expert(self, e: int, x: Tensor) -> Tensor:
        """Expert e on its tokens x (n, d) -> (n, d): the reference the grouped path must equal."""
        a = x @ self.up[e]
        a = F.silu(x @ self.gate[e]) * a if self.gated else F.gelu(a)
        return a @ self.down[e]

    def run(self, xs: Tensor, offs: Tensor) -> Tensor:
        """Every expert on its segment of xs (N*k, d), sorted by expert; offs[e] ends expert e's rows."""
        a = grouped_matmul(xs, self.up, offs)
        a = F.silu(grouped_matmul(xs, self.gate, offs)) * a if self.gated else F.gelu(a)
        return grouped_matmul(a, self.down, offs)


class ExpertPools(nn.Module):
    """All pools of an allocation and the routers that read them; call it per layer."""

    def __init__(self, spec: ExpertPool, d_model: int, gated: bool, std: float, resid_std: float) -> None:
        super().__init__()
        self.spec = spec
        self.pool_of_layer = list(spec.pool_of_layer)
        self.top_k = spec.top_k
        self.pools = nn.ModuleList(ExpertBank(n, d_model, spec.d_expert, gated, std, resid_std)
                                   for n in spec.pool_sizes)
        # a router per layer, or one per pool that every layer of the pool reads
        self.routers = nn.ParameterList(nn.Parameter(torch.empty(rows, d_model).normal_(0.0, std))
                                        for rows in spec.router_rows())
        self._stats: list[list[Tensor]] = PerForward()

    def router_of(self, layer: int) -> Tensor:
        return self.routers[self.pool_of_layer[layer] if self.spec.router == "shared" else layer]

    def reset(self) -> None:
        """Start a forward pass: clear each pool's routing statistics."""
        self._stats = PerForward([] for _ in self.pools)

    def forward(self, x: Tensor, layer: int) -> Tensor:
        """The mixture's output for x (B, T, d), already normed, at depth `layer`."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # (N, d)
        pool = self.pool_of_layer[layer]
        bank = self.pools[pool]
        probs = F.linear(x, self.router_of(layer)).float().softmax(-1)  # (N, P)
        # raw top-k probabilities as gates (Switch): renormalising would make a k=1 gate constant 1
        # and cut the task loss's gradient to the router
        gate, idx = probs.topk(self.top_k, dim=-1)  # (N, k)
        flat = idx.reshape(-1)
        order = flat.argsort(stable=True)  # assignments grouped by expert
        counts = torch.bincount(flat, minlength=probs.shape[1])
        tok = order // self.top_k  # the token of each sorted assignment
        offs = counts.cumsum(0).to(torch.int32)  # end row of each expert's segment
        ys = bank.run(x[tok], offs).to(x.dtype) * gate.reshape(-1)[order].unsqueeze(1).to(x.dtype)  # (N*k, d)
        if self._stats:
            self._stats[pool].append(torch.stack([counts.to(probs.dtype) / self.top_k, probs.sum(0)]))
        return torch.zeros_like(x).index_add_(0, tok, ys).view(shape)

    def balance_loss(self) -> Tensor:
        """Mean over pools of P * sum_e f_e p_e, over all layers that read each pool this pass."""
        losses = []
        for stats in self._stats:
            if stats:
                counts, prob_sum = torch.stack(stats).sum(0)  # (P,), (P,): assignments/k and probabilities
                tokens = counts.sum()  # each token contributes k assignments, counted as 1 after /k
                losses.append(counts.numel() * torch.sum(counts / tokens * prob_sum / tokens))
        return torch.stack(losses).mean() if losses else torch.zeros(())
