"""Matrix atoms for attention (MASA) vs the untied model and vs cycle / sequential tying of attention.

    python experiments/evidence/atoms.py            # report: d_model 64, 8 layers, 5 seeds
    python experiments/evidence/atoms.py --plan     # the arms, their accounting and the run plan; no training
    python experiments/evidence/atoms.py --quick    # smoke run

Claim (MASA): atoms at about a third of the layers' attention matrices reach the untied model's
loss with about 66.7% fewer attention parameters, and beat cycle and sequential tying at the same
attention-parameter budget. Arms (all with one block per layer; only attention is shared):
  untied          the reference: every layer owns its Q, K, V and O
  atoms           Q, K, V and O of every layer are each a learned mix of K shared d x d atoms (one
                  dictionary per projection type, per-layer coefficients), K = round(L/3), at least 2
                  (at K = 1 cycle and sequential tying would both be full tying). MLP as the reference.
  cycle_attn      K unique Q/K/V/O sets, layer i uses set i mod K (ABCABC..); MLPs untied
  sequential_attn K unique sets, each used by adjacent layers (AAABBBCC..); MLPs untied
The tied arms hold their attention in `tie` banks (one bank per projection type and group), and
their MLP width is fitted (`npas.allocation.fit.fit_width`, mode mlp) so that stored parameters
are the atoms arm's to within one width step.

What is held equal, and what is not:
  atoms vs untied          same shapes, so the same FLOPs per token and MLP; atoms store fewer attention
                           parameters (printed, with the saving) and so fewer parameters in all
  atoms vs the tied arms   stored parameters (within the fit step) and FLOPs per token; attention
                           parameters: K x 4d^2 in all three, plus the atoms' 4 x L x K coefficients
The claims are read from paired (same-seed) differences with a 95% t-interval over seeds
(`stats.claim_verdict`): "beats" is reproduced only if the interval lies below 0, "reaches" (parity)
only if it lies below +0.02 nats (`stats.PARITY_MARGIN`).
"""

from __future__ import annotations

import math

import common
import report
import runs
import stats

import npas
from npas import ArchConfig, Bank, Chassis
from npas.allocation.config import ATTN_SLOTS, MLP_SLOTS, AtomSpec, slot_shape
from npas.allocation.fit import fit_width
from npas.allocation.layer_maps import tying_map

REF = "untied"
ARMS = ("untied", "atoms", "cycle_attn", "sequential_attn")
FULL_SEEDS = 5  # a t-interval on 3 seeds is 2.5 paired stds wide each side; on 5, 1.2
CLAIMS = (  # (arm, reference, kind, words)
    ("atoms", "untied", "parity", "atoms reach untied"),
    ("atoms", "cycle_attn", "better", "atoms beat cycle_attn"),
    ("atoms", "sequential_attn", "better", "atoms beat sequential_attn"),
)


# Runs trained at these code versions are stale for every claim here: atoms had no learning-rate rule of
# their own in the fair parameterization (the parameterization defect fixed separately), so the atoms arm
# trained at rates no rule chose. A rerun at the fixed code writes records of a new version, which clears it.
STALE_VERSIONS = {"c8bd6d7bad": "measured while atoms had no learning-rate rule in the fair parameterization; "
                                "rerun the arms at the fixed code"}


def stale_reason(results: list[dict]) -> str | None:
    """Why the claims read from ``results`` are stale, or None (quick runs carry no code version)."""
    reasons = sorted({STALE_VERSIONS[v] for r in results if (v := r.get("code_version")) in STALE_VERSIONS})
    return "; ".join(reasons) or None


def n_atoms(L: int) -> int:
    return max(2, round(L / 3))


def attention_tied(ch: Chassis, mode: str, unique: int, widths: tuple[int, ...]) -> ArchConfig:
    """Untied blocks whose Q/K/V/O are tied across the layers of each `mode` group (one `tie` bank per
    projection type and group: every member reads the same d x d tensor)."""
    L, d = ch.n_layers, ch.d_model
    group = tying_map(mode, L, unique)
    banks = tuple(Bank(tuple((i, s) for i in range(L) if group[i] == g), "tie", d * d)
                  for s in ATTN_SLOTS for g in range(max(group) + 1))
    return ArchConfig(chassis=ch, mlp_widths=widths, block_of_layer=tuple(range(L)), banks=banks)


def attention_params(cfg: ArchConfig) -> int:
    """Stored parameters of the attention projections: all but embeddings, norms and (untied) MLPs."""
    acc = npas.count(cfg)
    c = cfg.chassis
    mlp = sum(math.prod(slot_shape(s, c.d_model, w)) for w in cfg.mlp_widths for s in MLP_SLOTS[c.activation])
    return acc.stored_params - acc.embedding_params - acc.norm_params - acc.lora_params - mlp


def arms(setup: common.Setup) -> tuple[dict[str, ArchConfig], dict[str, dict]]:
    ch = setup.chassis
    L, K = ch.n_layers, n_atoms(ch.n_layers)
    ref = npas.reference_config(ch)
    atoms = ArchConfig(chassis=ch, mlp_widths=ref.mlp_widths, block_of_layer=ref.block_of_layer,
                       atoms=tuple(AtomSpec(s, K) for s in ATTN_SLOTS))
    budget = npas.count(atoms).stored_params
    configs = {"untied": ref, "atoms": atoms}
    acc = {name: common.accounting_row(name, cfg, ref, recipe=setup.recipe) for name, cfg in configs.items()}
    for mode in ("cycle", "sequential"):
        fit = fit_width(lambda c, w, mode=mode: attention_tied(c, mode, K, w), ch, [1.0] * L, budget, "mlp",
                        common.MAX_WIDTH_SCALE)
        if fit.config is None:
            raise SystemExit(f"{mode} tying of attention does not fit the atoms arm's {budget:,} params: {fit.reason}")
        configs[f"{mode}_attn"] = fit.config
        acc[f"{mode}_attn"] = common.accounting_row(f"{mode}_attn", fit.config, ref, budget, fit.step, setup.recipe)
    untied_attn = attention_params(ref)
    for name, cfg in configs.items():
        acc[name]["attention_params"] = a = attention_params(cfg)
        acc[name]["attention_saving"] = 1 - a / untied_attn
    acc["atoms"]["n_atoms"] = K
    return configs, acc


def plan(setup: common.Setup, configs: dict[str, ArchConfig]) -> dict[str, int]:
    r = setup.recipe
    n_runs = len(configs) * len(setup.seeds)
    tokens = r.steps * r.tokens_per_step
    print(f"plan: {len(configs)} arms x {len(setup.seeds)} seeds = {n_runs} runs x {tokens:,} tokens "
          f"({r.steps} steps x {r.batch_size}x{r.seq_len}) = {n_runs * tokens:,} tokens, on {setup.workers} workers",
          flush=True)
    return {"runs": n_runs, "tokens_per_run": tokens, "tokens": n_runs * tokens}


def main() -> None:
    parser = common.arg_parser(__doc__)
    args = parser.parse_args()
    if args.seeds is None and not args.quick:
        args.seeds = FULL_SEEDS
    setup = common.setup_from(args, "atoms")
    configs, acc = arms(setup)
    common.print_accounting(list(acc.values()))
    for name, a in acc.items():
        print(f"  {name:16s} attention params {a['attention_params']:,} ({a['attention_saving']:.1%} fewer than untied)"
              f"{'  K=' + str(a['n_atoms']) + ' atoms per projection type' if 'n_atoms' in a else ''}")
    planned = plan(setup, configs)
    results = runs.run_arms(configs, setup)  # --plan: prints the cache-aware plan and trains nothing
    if args.plan:
        return
    extra = {n: {"attn params": f"{a['attention_params']:,}"} for n, a in acc.items()}
    summary = report.print_results(setup, results, list(ARMS), REF, acc, extra)
    stale = stale_reason(results)
    print("\nclaims: paired Δ = loss(arm) - loss(reference), mean [95% t-interval] over shared seeds, validation "
          "split (the test split beside it; a verdict needs both: `stats.split_verdict`)")
    if stale:
        print(f"STALE: every claim below was {stale}")
    claims, all_ok = [], True
    for arm, ref, kind, words in CLAIMS:
        iv = stats.paired_interval(results, arm, ref)
        test_iv = stats.paired_interval(results, arm, ref, "test_loss")
        ok, why = stats.claim_verdict(iv, kind)
        verdict = stats.split_verdict(results, arm, ref, kind)
        ok = verdict == "reproduced"
        all_ok &= ok
        test = f"Δ < +{stats.PARITY_MARGIN} nats" if kind == "parity" else "Δ < 0"
        detail = why
        if test_iv.value is not None:
            detail = f"validation: {why}; test split {report.fmt_interval(test_iv)}: {stats.claim_verdict(test_iv, kind)[1]}"
            if verdict.startswith("unresolved (the splits disagree"):
                detail += "; the splits disagree, so unresolved"
        print(f"claim {words} ({test}): Δ {report.fmt_interval(iv)} over {iv.n} seed(s): "
              f"{'REPRODUCED' if ok else 'NOT REPRODUCED'} ({detail})" + (" [stale]" if stale else ""))
        claims.append({"arm": arm, "reference": ref, "kind": kind, "claim": words, "interval": iv.to_dict(),
                       "test_interval": test_iv.to_dict(), "reproduced": ok, "why": why, "verdict": verdict,
                       "stale": stale})
    saving = acc["atoms"]["attention_saving"]
    print(f"seed claim (atoms at K={acc['atoms']['n_atoms']} of L={setup.chassis.n_layers}, {saving:.1%} fewer "
          f"attention params): {'REPRODUCED' if all_ok else 'NOT REPRODUCED'}" + (f" [stale: {stale}]" if stale else ""))
    report.save_json(setup, {"accounting": acc, "results": results, "summary": summary, "claims": claims,
                             "claim_reproduced": all_ok, "plan": planned, "parity_margin": stats.PARITY_MARGIN,
                             "stale": stale})
    plot(setup, summary, claims)
    report.finish(setup)


def plot(setup: common.Setup, summary: list[dict], claims: list[dict]) -> None:
    plt = report.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    report.loss_bars(a, setup, summary)
    report.claim_bars(b, claims, [c["reproduced"] for c in claims],
                      [f"{c['arm']} - {c['reference']}" for c in claims], margin=stats.PARITY_MARGIN)
    b.legend(fontsize=7)
    report.save_figure(setup, fig)


if __name__ == "__main__":
    main()
