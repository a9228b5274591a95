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

Weight gradients: autograd gives every layer that reads a pool its own gradient of the whole pool,
(P, d, w) per matrix, allocated, written and added into the running sum, so a pool shared by L
layers costs about 5 L pool-sized memory passes per step however few tokens each expert saw. On CPU
with few tokens per expert that dominates what a larger pool adds to a step (global pool 4x larger,
32 tokens an expert, bench/sharing_overhead.py). There, each layer's backward instead adds
x_e^T dy_e into one pool-sized sum per pass, in place, for the experts that received tokens only
(`_Deferred`), and the pool's view (`_PoolMatrix`) hands the sum to autograd once every layer is
done: 2 passes over the touched experts per layer. The sums are the same products in another order:
equal to autograd's gradient up to float rounding. With many tokens per expert, or off CPU (where
grouped_mm's backward is one kernel and memory is fast), autograd's own gradient is kept, bitwise
as before (`DEFER_BELOW`).

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
from torch.autograd import Function
from torch.autograd.function import once_differentiable

from npas.allocation.config import ExpertPool

# device type -> whether F.grouped_mm ran there; set on first use, a failure falls back to the loop
GROUPED_MM: dict[str, bool] = {}
# defer a pool's weight gradients (CPU only) when a layer routes fewer rows than this per expert. On the
# bench/sharing_overhead.py shapes (d 128, w 512, 8 layers, 1 thread, CPU time on a loaded machine):
# mixture fwd+bwd of a 64-expert pool at 32 rows an expert 845 -> 771 ms; the 16-expert pool at 128
# rows an expert 583 -> 619 ms (slower), hence the cut between them
DEFER_BELOW = 64


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


class _Deferred:
    """One pool matrix's weight gradient over a forward pass, summed in place from every layer that
    read it: each layer's backward adds x_e^T dy_e into expert e's slice, for the experts that received
    tokens only; `grad` hands the sum over."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.sum: Tensor | None = None

    def add(self, x: Tensor, dy: Tensor, counts: Tensor) -> None:
        if self.sum is None:
            self.sum = dy.new_zeros(self.n, x.shape[1], dy.shape[1])
        ends = counts.cumsum(0).tolist()
        for e, (s, t) in enumerate(zip([0, *ends[:-1]], ends, strict=True)):
            if t > s:
                self.sum[e].addmm_(x[s:t].t(), dy[s:t])

    def grad(self, dtype: torch.dtype) -> Tensor | None:
        out, self.sum = self.sum, None  # a second backward (retain_graph) sums afresh
        return None if out is None else out.to(dtype)


class _PoolMatrix(Function):
    """Identity on a pool matrix, once per forward pass; its backward runs after every layer that read
    the view and returns the gradient they deferred to `sink`. The layers' own backward returns None
    for the weight, so autograd never builds a per-layer pool-sized gradient."""

    @staticmethod
    def forward(ctx, weight: Tensor, sink: _Deferred) -> Tensor:
        ctx.set_materialize_grads(False)
        ctx.sink, ctx.dtype = sink, weight.dtype  # nothing saved: a view reused by a later pass still works
        return weight.view_as(weight)

    @staticmethod
    @once_differentiable
    def backward(ctx, _unused: Tensor | None):
        return ctx.sink.grad(ctx.dtype), None


class _GroupedMatmul(Function):
    """`grouped_matmul(x, w, offs)`, whose weight gradient goes to the pool's `_Deferred`."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, offs: Tensor, counts: Tensor, sink: _Deferred) -> Tensor:
        out = grouped_matmul(x, w, offs)
        ctx.sink = sink
        ctx.save_for_backward(x, w, offs, counts)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: Tensor):
        x, w, offs, counts = ctx.saved_tensors
        dy = dy.contiguous()
        if ctx.needs_input_grad[1]:
            ctx.sink.add(x.to(dy.dtype) if x.dtype != dy.dtype else x, dy, counts)
        dx = None
        if ctx.needs_input_grad[0]:
            dx = grouped_matmul(dy, w.transpose(1, 2), offs).to(x.dtype)
        return dx, None, None, None, None


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

    def run(self, xs: Tensor, offs: Tensor, counts: Tensor | None = None,
            views: dict[str, tuple[Tensor, _Deferred]] | None = None) -> Tensor:
        """Every expert on its segment of xs (N*k, d), sorted by expert; offs[e] ends expert e's rows.

        With `views` (this pass's `_PoolMatrix` views and their collectors, by matrix name) the weight
        gradients are deferred to the pool; without, autograd computes them per call."""
        def mm(inp: Tensor, name: str) -> Tensor:
            if views is None or name not in views:  # not deferred: autograd's own gradient, per call
                return grouped_matmul(inp, getattr(self, name), offs)
            view, sink = views[name]
            return _GroupedMatmul.apply(inp, view, offs, counts, sink)

        a = mm(xs, "up")
        a = F.silu(mm(xs, "gate")) * a if self.gated else F.gelu(a)
        return mm(a, "down")

    def matrices(self) -> tuple[str, ...]:
        return ("up", "gate", "down") if self.gated else ("up", "down")

    def deferred_views(self) -> dict[str, tuple[Tensor, _Deferred]]:
        """One `_PoolMatrix` view per matrix that needs a gradient, for the layers of one pass to read."""
        views = {}
        for name in self.matrices():
            w = getattr(self, name)
            if w.requires_grad:
                sink = _Deferred(w.shape[0])
                views[name] = (_PoolMatrix.apply(w, sink), sink)
        return views


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
        self._stats: list[list[Tensor]] = []
        self._views: list[dict[str, tuple[Tensor, _Deferred]] | None] = []  # per pool, this pass's

    def router_of(self, layer: int) -> Tensor:
        return self.routers[self.pool_of_layer[layer] if self.spec.router == "shared" else layer]

    def reset(self) -> None:
        """Start a forward pass: clear each pool's routing statistics."""
        self._stats = [[] for _ in self.pools]
        self._views = [None for _ in self.pools]  # made by the first layer of the pass that reads the pool

    def _views_of(self, pool: int, rows: int, device: torch.device) -> dict[str, tuple[Tensor, _Deferred]] | None:
        """This pass's deferred-gradient views of a pool, or None for autograd's own gradients: off CPU,
        with `DEFER_BELOW` rows an expert or more, with autograd off, or where nothing of the pool needs
        a gradient. Called without `reset` (a lone call), a call gets its own views."""
        bank = self.pools[pool]
        if device.type != "cpu" or rows >= DEFER_BELOW * bank.up.shape[0] or not torch.is_grad_enabled():
            return None
        if not any(getattr(bank, n).requires_grad for n in bank.matrices()):
            return None
        if not self._views:
            return bank.deferred_views()
        if self._views[pool] is None:
            self._views[pool] = bank.deferred_views()
        return self._views[pool]

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
        views = self._views_of(pool, flat.numel(), x.device)
        ys = bank.run(x[tok], offs, counts, views if views else None).to(x.dtype)
        ys = ys * gate.reshape(-1)[order].unsqueeze(1).to(x.dtype)  # (N*k, d)
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
