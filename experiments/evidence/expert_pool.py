"""A global expert pool vs per-layer MoE at equal activated FLOPs (UniPool / MoUE / Megrez2).

    python experiments/evidence/expert_pool.py            # report: d_model 64, 8 layers, 3 seeds
    python experiments/evidence/expert_pool.py --quick    # smoke run

Claim (UniPool): one pool of experts shared by every layer, each layer routing with its own router,
at 41.6-66.7% of the per-layer experts' parameters matches or beats per-layer MoE (each layer its
own E experts) at equal activated FLOPs.

Arms: every MoE arm runs k = 2 experts of width d_ff / 2 per token and layer, so a token activates
exactly the dense MLP's width and every arm's FLOPs per token equal the dense model's up to the
routers' scores (printed). `per_layer_moe` holds E = 4 experts in each layer; `global_pool_50` and
`global_pool_67` hold one pool of 50% and 67% of those L x E experts. `dense` is the dense model of
equal activated FLOPs (the untied reference). The balance loss (weight 0.01) trains with the LM loss.
"Matches" means the paired same-seed Δ to per-layer MoE is at most MATCH nats.
"""

from __future__ import annotations

import common
import report
import runs

import npas
from npas import ArchConfig, Chassis, reference_config
from npas.allocation.config import ExpertPool

E, K = 4, 2  # experts per layer of the per-layer baseline, experts per token
MATCH = 0.01  # nats: a paired difference this small counts as a match (seed noise on this setup is larger)
REF = "per_layer_moe"
CLAIM_ARM = "global_pool_50"


def arms(ch: Chassis) -> dict[str, ArchConfig]:
    L = ch.n_layers

    def moe(pools: tuple[int, ...], of_layer: tuple[int, ...]) -> ArchConfig:
        return ArchConfig(chassis=ch, mlp_widths=(ch.d_ff,) * L, block_of_layer=tuple(range(L)),
                          experts=ExpertPool(pools, of_layer, ch.d_ff // K, K))

    return {
        "dense": reference_config(ch),
        "per_layer_moe": moe((E,) * L, tuple(range(L))),
        "global_pool_50": moe((L * E // 2,), (0,) * L),
        "global_pool_67": moe((round(L * E * 2 / 3),), (0,) * L),
    }


def main() -> None:
    args = common.arg_parser(__doc__).parse_args()
    setup = common.setup_from(args, "expert_pool")
    configs = arms(setup.chassis)
    ref_cfg = configs["dense"]
    acc = {name: common.accounting_row(name, cfg, ref_cfg) for name, cfg in configs.items()}
    common.print_accounting(list(acc.values()))
    base = npas.count(configs[REF]).expert_params
    print("\nexperts (stored = every pool expert + routers; activated = what one token multiplies with):")
    rows = []
    for name, cfg in configs.items():
        a = npas.count(cfg)
        share = f"{a.expert_params / base:.3f}" if cfg.experts else "-"
        acc[name].update(expert_params=a.expert_params, activated_params=a.activated_params)
        rows.append([name, f"{a.expert_params:,}", share, f"{a.activated_params:,}", f"{acc[name]['flops_ratio']:.3f}"])
    print(report.format_table(["config", "expert params", f"x {REF}", "activated params", "FLOPs xdense"], rows))
    # cached, and --plan trains nothing (it used to call the pool without either: --plan trained every run);
    # no learning-rate check: every arm shares the dense MLP's activated width
    results = runs.run_arms(configs, setup, lr_check=False)
    summary = report.print_results(setup, results, list(configs), REF, acc)
    row = next(r for r in summary if r["name"] == CLAIM_ARM)
    delta = row.get("delta_mean", float("nan"))
    claim = delta == delta and delta <= MATCH
    share = acc[CLAIM_ARM]["expert_params"] / base
    print(f"global pool at {share:.1%} of per-layer MoE's expert params: Δ = {delta:+.4f} nats (match <= {MATCH})")
    print(f"claim global pool matches or beats per-layer MoE at equal activated FLOPs: "
          f"{'REPRODUCED' if claim else 'NOT REPRODUCED'}")
    report.save_json(setup, {"accounting": acc, "results": results, "summary": summary, "claim_reproduced": claim,
                             "expert_share": share, "delta": delta})
    report.finish(setup)


if __name__ == "__main__":
    main()
