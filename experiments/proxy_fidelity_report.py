"""The proxy-fidelity bench's report: its side-by-side table, Kendall tau with the verdict, and the
rows that say where a miss comes from (the long seeds' ceiling, the proxy's repeats, the proxy at
2x its steps).

Only statistics and printing live here; ``experiments/proxy_fidelity.py`` chooses the candidates, trains
and caches the runs, and hands this module the cached records. tau and its bootstrap interval are
``npas.service.study.fidelity.rank_correlation``, the statistic ``npas validate`` reports.
"""

from __future__ import annotations

import math
import statistics
import warnings
from typing import TYPE_CHECKING

import npas
from npas.service.study.fidelity import BOOTSTRAP, paired_delta, rank_correlation
from npas.service.study.ladder import agreement as ladder_agreement
from npas.training.recipe import PARAMETERIZATIONS

if TYPE_CHECKING:
    from experiments.proxy_fidelity import Candidate, Setup

TOP = 5  # tau among the best proxy candidates, where a user actually chooses
TARGET_TAU, TARGET_LOW = 0.7, 0.3
DEFAULT_PAR = PARAMETERIZATIONS[0]  # the parameterization a search uses: the only one the proxy repeats


# ------------------------------------------------------------------------------------------ statistics
def ranked(values: list[float]) -> list[float]:
    """Failed runs (inf/None) rank last, tied with each other; finite values kept as they are."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    worst = (max(finite) + 1.0) if finite else 1.0
    return [v if v is not None and math.isfinite(v) else worst for v in values]


def _loss(rec: dict, field: str) -> float:
    v = rec.get(field) if rec.get("status") == "ok" else None
    return float(v) if v is not None else math.inf


def report(setup: Setup, cands: list[Candidate], res: dict[tuple, dict]) -> dict[str, dict]:
    """Print the side-by-side table and the statistics from the cached records ``res`` (keyed by
    candidate hash, kind, seed, parameterization); return the statistics per row label."""
    S = len(setup.long_seeds)
    rows: dict[str, dict[str, tuple[float | None, list[float]]]] = {p: {} for p in PARAMETERIZATIONS}
    for c in cands:
        for par in PARAMETERIZATIONS:
            p = res.get((c.config.hash, "proxy", setup.proxy.seed, par))
            longs = [_loss(res[k], "test_loss") for s in setup.long_seeds
                     if (k := (c.config.hash, "long", s, par)) in res]
            rows[par][c.name] = (None if p is None else _loss(p, "val_loss"), longs)
    print(f"\nproxy = {setup.proxy.name} recipe ({setup.proxy.steps} steps, seed {setup.proxy.seed}), validation "
          f"loss; long = {setup.long.steps} steps ({setup.long.steps // setup.proxy.steps}x, same lr), test-split loss, mean over seeds "
          f"{list(setup.long_seeds)}; nats/char; '-' = not run yet, 'div' = failed")
    head = f"{'proxy':>8}{'long':>8}{'n':>3}"
    print(f"{'candidate':<14}{'fwd FLOPs/tok':>14}   {'fair':^19}   {'uniform':^19}")
    print(f"{'':<14}{'':>14}   {head}   {head}")
    for c in cands:
        cells = []
        for par in PARAMETERIZATIONS:
            p, longs = rows[par][c.name]
            mean = statistics.fmean(longs) if longs else None
            cells.append(f"{_cell(p)}{_cell(mean)}{len(longs):>3}")
        mark = "" if all(rows[q][c.name][0] is not None and len(rows[q][c.name][1]) == S
                         for q in PARAMETERIZATIONS) else "  incomplete"
        print(f"{c.name:<14}{c.flops:>14,}   {cells[0]}   {cells[1]}{mark}")
    stats = {"flops_spread": _print_flops_spread(setup, cands)}
    print()
    for par in PARAMETERIZATIONS:
        stats[par] = _stats(par, rows[par], cands, S)
        names = [c.name for c in cands if rows[par][c.name][1]]
        _print_noise(par, "the long runs", [rows[par][n][1] for n in names])
        if S > 1:
            stats[f"{par} ceiling"] = _ceiling(par, setup, [rows[par][n][1] for n in names])
    stats.update(_diagnostics(setup, cands, res, rows[DEFAULT_PAR], S))
    return stats


def _print_flops_spread(setup: Setup, cands: list[Candidate]) -> dict:
    """How far apart the candidates are in compute, at equal stored params: forward FLOPs per token at the
    chassis' context (`npas.count(cfg)`, the table's column) and at the proxy's sequence length (what the
    runs record; attention's share is smaller there). A ranking across a several-fold FLOPs spread is a
    ranking of compute as much as of allocation."""
    if not cands:
        return {}
    at_ctx = {c.name: c.flops for c in cands}
    at_seq = {c.name: npas.count(c.config, seq_len=setup.proxy.seq_len).flops_per_token for c in cands}
    lo, hi = min(at_ctx, key=at_ctx.get), max(at_ctx, key=at_ctx.get)
    ratio_ctx = at_ctx[hi] / at_ctx[lo]
    ratio_seq = max(at_seq.values()) / min(at_seq.values())
    print(f"forward FLOPs per token spread across the {len(cands)} candidates (equal stored params): {at_ctx[lo]:,} "
          f"({lo}) to {at_ctx[hi]:,} ({hi}) = {ratio_ctx:.1f}x at the chassis context; {ratio_seq:.1f}x at the "
          f"proxy's seq_len {setup.proxy.seq_len}")
    return {"min": at_ctx[lo], "max": at_ctx[hi], "ratio": ratio_ctx, "ratio_at_seq_len": ratio_seq}


def _ceiling(par: str, setup: Setup, longs: list[list[float]]) -> dict:
    """tau between the rankings of the first two long seeds: how well one long run predicts another,
    the most a proxy can be asked for (scored on candidates with both seeds)."""
    pairs = [v[:2] for v in longs if len(v) >= 2]
    s0, s1 = setup.long_seeds[:2]
    if len(pairs) < 3:
        print(f"{par:<8} ceiling: needs long seeds {s0} and {s1} on 3+ candidates; {len(pairs)} have both")
        return {"tau": math.nan, "low": math.nan, "high": math.nan, "n": len(pairs)}
    a, b = (ranked([v[i] for v in pairs]) for i in (0, 1))
    iv = rank_correlation(a, b)
    t, lo, hi = (math.nan if v is None else v for v in (iv.value, iv.low, iv.high))
    print(f"{par:<8} ceiling: Kendall tau between long seeds {s0} and {s1} over {len(pairs)} candidates = {_num(t)} "
          f"[95% bootstrap {_num(lo)}, {_num(hi)}]")
    return {"tau": t, "low": lo, "high": hi, "n": len(pairs)}


def _diagnostics(setup: Setup, cands: list[Candidate], res: dict[tuple, dict],
                 rows: dict[str, tuple[float | None, list[float]]], S: int) -> dict[str, dict]:
    """Where the default parameterization's miss comes from, against the same long runs: the proxy
    scored by its mean over the seeds `npas search --repeats R` trains (does averaging seeds buy the
    ranking one seed misses? then the miss was noise), and the proxy at `mid` steps on its own seed
    (does the ranking improve with the horizon? then the miss is curves that cross later)."""
    R, mid = len(setup.proxy_seeds), setup.mid
    per = {c.name: {s: _loss(res[k], "val_loss") for s in setup.proxy_seeds
                    if (k := (c.config.hash, "proxy", s, DEFAULT_PAR)) in res} for c in cands}
    mids = {c.name: _loss(res[k], "val_loss") if (k := (c.config.hash, "mid", setup.proxy.seed, DEFAULT_PAR)) in res
            else None for c in cands}
    means = {n: statistics.fmean(v.values()) if len(v) == R else None for n, v in per.items()}
    x = mid.steps // setup.proxy.steps
    print(f"\n{DEFAULT_PAR}, validation loss: the proxy on seeds {list(setup.proxy_seeds)}"
          + (f" and their mean (what `npas search --repeats {R}` scores)" if R > 1 else "")
          + f"; the proxy at {x}x its steps ({mid.steps}, seed {setup.proxy.seed}, same lr); the long column as above")
    head = "".join(f"{'seed ' + str(s):>10}" for s in setup.proxy_seeds) + (f"{'mean':>10}" if R > 1 else "")
    print(f"{'candidate':<14}{head}{f'{x}x steps':>10}{'long':>10}")
    for c in cands:
        v, longs = per[c.name], rows[c.name][1]
        print(f"{c.name:<14}" + "".join(f"{_cell(v.get(s)):>10}" for s in setup.proxy_seeds)
              + (f"{_cell(means[c.name]):>10}" if R > 1 else "")
              + f"{_cell(mids[c.name]):>10}{_cell(statistics.fmean(longs) if longs else None):>10}")
    print()
    out = {}
    if R > 1:
        label = f"{DEFAULT_PAR} R={R}"
        out[label] = _stats(label, {n: (m, rows[n][1]) for n, m in means.items()}, cands, S)
        _print_noise(label, "the proxy", [list(v.values()) for v in per.values() if len(v) == R])
    label = f"{DEFAULT_PAR} {x}x"
    out[label] = _stats(label, {n: (m, rows[n][1]) for n, m in mids.items()}, cands, S)
    names = [n for n, m in mids.items() if m is not None and rows[n][1] and rows[n][0] is not None]
    if 3 <= len(names) < len(cands):  # a partial row is only comparable with the proxy on the same candidates
        iv = rank_correlation(ranked([rows[n][0] for n in names]), ranked([statistics.fmean(rows[n][1]) for n in names]))
        t, lo, hi = (math.nan if v is None else v for v in (iv.value, iv.low, iv.high))
        print(f"{'':<8} on the same {len(names)} candidates the proxy at its own {setup.proxy.steps} steps gives "
              f"tau {_num(t)} [95% bootstrap {_num(lo)}, {_num(hi)}]: the {x}x row is {'above' if out[label]['tau'] > t else 'not above'} it")
        out[label]["proxy_tau_same_candidates"] = {"tau": t, "low": lo, "high": hi, "n": len(names)}
    return out


def _print_noise(label: str, what: str, losses: list[list[float]]) -> None:
    noise = _seed_noise(losses)
    if noise is not None:
        within, across, n = noise
        print(f"{label:<8} seed noise of {what}: mean within-candidate std {within:.4f} nats over {n} "
              f"candidates with >1 seed; std across candidates of their seed means {across:.4f}")


def _cell(v: float | None) -> str:
    if v is None:
        return f"{'-':>8}"
    return f"{v:>8.4f}" if math.isfinite(v) else f"{'div':>8}"


def _stats(par: str, rows: dict[str, tuple[float | None, list[float]]], cands: list[Candidate], S: int) -> dict:
    """tau over the candidates with a proxy score and at least one long seed; a verdict only when all
    candidates have every seed."""
    names = [c.name for c in cands if rows[c.name][0] is not None and rows[c.name][1]]
    complete = len(names) == len(cands) and all(len(rows[n][1]) == S for n in names)
    proxy = ranked([rows[n][0] for n in names])
    long = ranked([statistics.fmean(rows[n][1]) for n in names])
    iv = rank_correlation(proxy, long)  # the statistic `npas validate` reports, bootstrapped over candidates
    t, lo, hi = (math.nan if v is None else v for v in (iv.value, iv.low, iv.high))
    top = sorted(range(len(names)), key=proxy.__getitem__)[:TOP]
    t_top = rank_correlation([proxy[i] for i in top], [long[i] for i in top], n_boot=0).value
    t_top = math.nan if t_top is None else t_top
    ok = math.isfinite(t) and t >= TARGET_TAU and math.isfinite(lo) and lo > TARGET_LOW
    verdict = ("PASS" if ok else "MISS") if complete else "INCOMPLETE"
    print(f"{par:<8} Kendall tau over {len(names)}/{len(cands)} candidates = {_num(t)} "
          f"[95% bootstrap {_num(lo)}, {_num(hi)}; {BOOTSTRAP} resamples] | tau among the {min(TOP, len(top))} "
          f"best proxy = {_num(t_top)} | target tau >= {TARGET_TAU} and lower bound > {TARGET_LOW}: {verdict}")
    return {"tau": t, "low": lo, "high": hi, "tau_top": t_top, "n": len(names), "complete": complete,
            "verdict": verdict}


def _seed_noise(losses: list[list[float]]) -> tuple | None:
    """(mean within-candidate std, std across candidates of their means, candidates) over the
    candidates with more than one seed, all finite."""
    multi = [v for v in losses if len(v) > 1 and all(math.isfinite(x) for x in v)]
    if not multi:
        return None
    within = statistics.fmean(statistics.stdev(v) for v in multi)
    means = [statistics.fmean(v) for v in multi]
    across = statistics.stdev(means) if len(means) > 1 else math.nan
    return within, across, len(multi)


def _num(v: float) -> str:
    return f"{v:+.3f}" if math.isfinite(v) else "n/a"


# ------------------------------------------------------------------------------------------ horizon rows
TOP_RECALL = 3  # top-k recall: how many of the long runs' k best the row also puts in its k best
RESOLVE_SIGMAS = 2.0  # a pair is resolvable when its long-run gap exceeds this many std of the gap


def horizon_report(setup: Setup, cands: list[Candidate], res: dict[tuple, dict]) -> dict[str, dict]:
    """The horizon rows over every candidate, all under the default parameterization, against the long
    cosine runs' mean test loss: today's cosine proxy; WSD forks at T/16 and T/4 (finished-at-t
    validation losses of the one WSD run per candidate); that run's own end at T (test loss: the
    long runs' split) against cosine at T; and the ceiling, long seed against long seed. Each row:
    Kendall tau with its bootstrap interval, tau over the pairs the long runs resolve, top-3 recall.
    The target line: a paired bootstrap (candidates resampled, the same draw for both rows) of
    tau(fork at T/4) - tau(proxy), whose interval must lie above 0."""
    if setup.wsd is None:
        return {}
    par, seed0 = DEFAULT_PAR, setup.proxy.seed
    rungs = setup.wsd.fork_rungs()
    T = setup.wsd.steps

    def rec(c: Candidate, kind: str, seed: int) -> dict | None:
        return res.get((c.config.hash, kind, seed, par))

    def rung(c: Candidate, t: int) -> float | None:
        r = rec(c, "wsd", seed0)
        if r is None:
            return None
        v = (r.get("rung_losses") or {}).get(str(t)) if r.get("status") == "ok" else None
        return math.inf if v is None else float(v)

    longs = {c.name: [_loss(r, "test_loss") for s in setup.long_seeds if (r := rec(c, "long", s)) is not None]
             for c in cands}
    columns: dict[str, dict[str, float | None]] = {
        f"proxy {setup.proxy.steps}": {c.name: None if (r := rec(c, "proxy", seed0)) is None else _loss(r, "val_loss")
                                       for c in cands}}
    for t in rungs[:-1]:
        columns[f"fork {t}"] = {c.name: rung(c, t) for c in cands}
    columns[f"wsd {T}"] = {c.name: None if (r := rec(c, "wsd", seed0)) is None else _loss(r, "test_loss")
                           for c in cands}
    S = len(setup.long_seeds)
    print(f"\nhorizon rows ({par}, {len(cands)} candidates, T = {T} steps = the long runs): the cosine proxy "
          f"({setup.proxy.steps} steps) and one WSD run to T per candidate ({setup.wsd.decay_fraction:g} "
          f"{setup.wsd.decay_shape} decay, seed {seed0}), forked at {', '.join(map(str, rungs[:-1]))} "
          f"(validation loss); wsd {T}: its own end (test loss); long: cosine at T, test loss, mean over seeds "
          f"{list(setup.long_seeds)}")
    print(f"{'candidate':<14}{'fwd FLOPs/tok':>14}" + "".join(f"{k:>11}" for k in columns) + f"{'long':>11}{'n':>3}")
    for c in cands:
        mean = statistics.fmean(longs[c.name]) if longs[c.name] else None
        print(f"{c.name:<14}{c.flops:>14,}" + "".join(f"{_cell(col[c.name]):>11}" for col in columns.values())
              + f"{_cell(mean):>11}{len(longs[c.name]):>3}")
    sigma = _pooled_sigma([v for v in longs.values() if len(v) > 1])
    gap_sd = None if sigma is None else sigma * math.sqrt(2 / S)
    print(f"resolvable pairs: long-mean gap > {RESOLVE_SIGMAS:g} x {_num(gap_sd or math.nan)} nats (the pooled "
          f"seed std {_num(sigma or math.nan)} x sqrt(2/{S}): the std of a gap between two {S}-seed means)")
    stats: dict[str, dict] = {}
    full = [c.name for c in cands if len(longs[c.name]) == S]
    target = {n: statistics.fmean(longs[n]) for n in full}
    for label, col in columns.items():
        stats[label] = _horizon_row(label, col, target, gap_sd, len(cands))
    if S > 1:
        pairs = {n: longs[n][:2] for n in full}
        stats["ceiling"] = _horizon_row(f"ceiling (long {setup.long_seeds[0]} vs {setup.long_seeds[1]})",
                                        {n: v[0] for n, v in pairs.items()}, {n: v[1] for n, v in pairs.items()},
                                        gap_sd, len(cands))
    # does truth depend on the schedule? the level of WSD at T against cosine at T (the long runs' mean),
    # paired by candidate; the seeds differ (0 vs the long seeds), so seed noise is inside the interval
    both = [n for n in full if columns[f"wsd {T}"].get(n) is not None and math.isfinite(columns[f"wsd {T}"][n])]
    if len(both) >= 2:
        iv = paired_delta([columns[f"wsd {T}"][n] for n in both], [target[n] for n in both])
        lower = sum(columns[f"wsd {T}"][n] < target[n] for n in both)
        print(f"wsd {T} - long (cosine at T), paired over {len(both)}/{len(cands)} candidates: {_num(iv.value)} nats "
              f"[95% t {_num(iv.low)}, {_num(iv.high)}]; WSD lower on {lower} of {len(both)}")
        stats["wsd_vs_cosine"] = {"delta": iv.value, "low": iv.low, "high": iv.high, "n": len(both), "lower": lower}
    # the target compares the fork at T/4 (the proxy's own length in the full bench) with the proxy
    label = f"fork {T // 4}" if f"fork {T // 4}" in columns else (f"fork {rungs[-2]}" if len(rungs) > 1 else None)
    if label is not None:
        stats["target"] = _delta_target(columns[label], columns[f"proxy {setup.proxy.steps}"], target, len(cands),
                                        label, f"proxy {setup.proxy.steps}")
    stats["why"] = _why_rows(columns, target, f"proxy {setup.proxy.steps}", f"wsd {T}", len(cands))
    stats.update(_ladder_rows(setup, cands, res, columns[f"proxy {setup.proxy.steps}"], target, gap_sd))
    return stats


def _why_rows(columns: dict[str, dict[str, float | None]], target: dict[str, float], proxy: str, wsd_t: str,
              n_all: int) -> dict[str, dict]:
    """Why a short row misses truth: schedule or horizon? If the fork at T/4 ranked like the WSD run's
    own end at T while the cosine proxy did not, the miss would be the schedule's; if the two 400-step
    rows agree with each other and both miss T, candidates cross over between T/4 and T whatever the
    schedule, and no finished-at-t loss at t < T can rank them. The WSD-at-T column is one seed (0)
    and is the very run the forks branch from (they share its first 0.8 t steps), so its agreement with
    the forks is, if anything, flattered; no verdict rests on these rows."""
    out: dict[str, dict] = {}
    wsd = {n: v for n, v in columns[wsd_t].items() if n in target and v is not None and math.isfinite(v)}
    print(f"diagnostic (why): the short rows against {wsd_t} (seed 0, the forks' own run; resolvable pairs not "
          "defined: one seed), and the two 400-step rows against each other")
    for label, col in columns.items():
        if label != wsd_t:
            out[f"{label} vs {wsd_t}"] = _horizon_row(f"{label} vs {wsd_t}", col, wsd, None, n_all)
    forks = [k for k in columns if k.startswith("fork ")]
    if forks:
        other = {n: v for n, v in columns[proxy].items() if n in target and v is not None}
        out[f"{forks[-1]} vs {proxy}"] = _horizon_row(f"{forks[-1]} vs {proxy}", columns[forks[-1]], other, None,
                                                     n_all)
    return out


def _ladder_rows(setup: Setup, cands: list[Candidate], res: dict[tuple, dict], proxy: dict[str, float | None],
                 target: dict[str, float], gap_sd: float | None) -> dict[str, dict]:
    """The ladder row (issue #34 item 7), replayed from the WSD runs' rung losses over the candidates that
    have one (``experiments/proxy_fidelity_ladder.py``) under the product's rule (target N = the candidates,
    ranked on the rung loss and the analytic training memory, rungs closed at the end), in the bench's
    one sampler order, with its three targets: Delta tau (ladder - proxy) above 0, top-3 recall >= 2/3,
    compute <= 0.5 x N x T steps, forks counted. One order is one draw: ``experiments/ladder_orders.py``
    replays 500 orders and gives recall and regret as distributions."""
    from experiments.proxy_fidelity_ladder import WORKERS, replay, rung_losses_of

    assert setup.wsd is not None
    rungs, T = setup.wsd.fork_rungs(), setup.wsd.steps
    losses: dict[str, dict[int, float]] = {}
    for c in cands:
        got = rung_losses_of(res.get((c.config.hash, "wsd", setup.proxy.seed, DEFAULT_PAR)), T)
        if all(t in got for t in rungs):
            losses[c.name] = got
    if len(losses) < 3:
        print("ladder row: fewer than 3 candidates with a finished WSD run; nothing to replay")
        return {}
    order = [c.name for c in cands if c.name in losses]
    acc = {c.name: npas.count(c.config, batch_size=setup.wsd.batch_size, seq_len=setup.wsd.seq_len) for c in cands}
    flops = {n: float(a.flops_per_token) for n, a in acc.items()}
    memory = {n: (float(a.train_memory_bytes),) for n, a in acc.items()}
    n, full = len(order), len(order) == len(cands)

    def run(recipe: npas.Recipe):  # the product's rule: the search's N caps each rung
        return replay(order, losses, recipe, flops, target=n, objectives=memory)

    def spent(rep) -> tuple[float, float]:
        return rep.total_steps / (n * T), rep.total_flops / (T * sum(flops[c] for c in order))

    rep = run(setup.wsd)
    reach = {t: sum(v == t for v in rep.reached.values()) for t in rungs}
    print(f"\nladder ({n} of {len(cands)} candidates, sampler order, {WORKERS} workers, eta {rep.ladder.eta}, "
          f"rungs {', '.join(map(str, rungs))}, replayed from the WSD runs' rung losses under the search's rule: "
          f"target N = {n}, ranked on (rung loss, train memory); one order of many, see experiments/ladder_orders.py): "
          "reached " + ", ".join(f"{t}: {k}" for t, k in reach.items()))
    for rung in rungs[:-1]:
        ag = ladder_agreement(rep.ladder, rung)
        tau = "suppressed (< 10 pairs)" if ag.tau is None else f"{_num(ag.tau.value)} [{_num(ag.tau.low)}, {_num(ag.tau.high)}]"
        print(f"  rung {ag.rung} -> {ag.next_rung}: n {ag.n}, Kendall tau {tau}, rank flips {ag.flips} of {ag.pairs} pairs")
    score = rep.score()
    row = _horizon_row("ladder (rung, then loss)", {c.name: score.get(c.name) for c in cands}, target, gap_sd,
                       len(cands))
    frac, frac_flops = spent(rep)
    status = lambda ok: ("PASS" if ok else "MISS") if full else "INCOMPLETE"  # noqa: E731
    print(f"target: ladder compute {rep.total_steps:,} steps (forks counted) = {frac:.3f} x N x T "
          f"({n} x {T:,}) <= 0.5: {status(frac <= 0.5)}; in FLOPs {frac_flops:.3f} x N x T")
    print(f"target: ladder top-{TOP_RECALL} recall {row['top_recall']:.2f} >= 2/3 in this one order: "
          f"{status(row['top_recall'] >= 2 / 3 - 1e-9)}")
    delta = _delta_target({c.name: score.get(c.name) for c in cands}, proxy, target, len(cands), "ladder",
                          f"proxy {setup.proxy.steps}")
    out = {"ladder": {**row, "compute_fraction": frac, "flops_fraction": frac_flops, "steps": rep.total_steps,
                      "reached": reach}, "ladder_target": delta}
    # diagnostics, no target: the same replay on two rungs, the top and one below it (a WSD run's fork at
    # t is the same with or without a fork before it, so no new run)
    for low in rungs[:-1] if len(rungs) > 2 else ():
        alt = npas.Recipe.from_dict({**setup.wsd.to_dict(), "rungs": [low, T]})
        rep2 = run(alt)
        score2 = rep2.score()
        s2, f2 = spent(rep2)
        print(f"diagnostic: the ladder on rungs {low}, {T} only, same replay: {rep2.total_steps:,} steps = "
              f"{s2:.3f} x N x T ({f2:.3f} in FLOPs)")
        row2 = _horizon_row(f"ladder {low}/{T}", {c.name: score2.get(c.name) for c in cands}, target, gap_sd,
                            len(cands))
        out[f"ladder_{low}_{T}"] = {**row2, "compute_fraction": s2, "flops_fraction": f2, "rungs": [low, T]}
    return out


def _pooled_sigma(losses: list[list[float]]) -> float | None:
    """sqrt of the mean within-candidate variance of the finite multi-seed losses."""
    multi = [v for v in losses if len(v) > 1 and all(math.isfinite(x) for x in v)]
    return math.sqrt(statistics.fmean(statistics.variance(v) for v in multi)) if multi else None


def _horizon_row(label: str, row: dict[str, float | None], target: dict[str, float], gap_sd: float | None,
                 n_all: int) -> dict:
    names = [n for n in target if row.get(n) is not None]
    x, y = ranked([row[n] for n in names]), ranked([target[n] for n in names])
    iv = rank_correlation(x, y)
    t, lo, hi = (math.nan if v is None else v for v in (iv.value, iv.low, iv.high))
    res_tau, n_res = _resolvable_tau(x, y, gap_sd)
    k = min(TOP_RECALL, len(names))
    recall = (len(set(sorted(range(len(names)), key=x.__getitem__)[:k])
                  & set(sorted(range(len(names)), key=y.__getitem__)[:k])) / k) if k else math.nan
    print(f"{label:<28} tau over {len(names)}/{n_all} = {_num(t)} [95% bootstrap {_num(lo)}, {_num(hi)}] | "
          f"tau over {n_res} resolvable pairs = {_num(res_tau)} | top-{k} recall {recall:.2f}")
    return {"tau": t, "low": lo, "high": hi, "n": len(names), "tau_resolvable": res_tau, "n_resolvable": n_res,
            "top_recall": recall}


def _resolvable_tau(x: list[float], y: list[float], gap_sd: float | None) -> tuple[float, int]:
    """(concordant - discordant) / pairs over the pairs whose target gap exceeds RESOLVE_SIGMAS x gap_sd."""
    if gap_sd is None:
        return math.nan, 0
    score = n = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            if abs(y[i] - y[j]) > RESOLVE_SIGMAS * gap_sd:
                n += 1
                score += int(math.copysign(1, (x[i] - x[j]) * (y[i] - y[j]))) if x[i] != x[j] else 0
    return (score / n if n else math.nan), n


def _delta_target(a: dict[str, float | None], b: dict[str, float | None], target: dict[str, float], n_all: int,
                  a_label: str, b_label: str, n_boot: int = BOOTSTRAP, seed: int = 0, prefix: str = "target") -> dict:
    """tau(a) - tau(b) against the target with a paired percentile bootstrap over candidates; PASS when
    its lower bound is above 0 (INCOMPLETE while a candidate lacks a run)."""
    import numpy as np
    from scipy import stats as sps

    names = [n for n in target if a.get(n) is not None and b.get(n) is not None]
    xa, xb, y = (np.asarray(ranked([d[n] for n in names]), float) for d in (a, b, target))

    def tau(u: np.ndarray, v: np.ndarray) -> float:
        return float(sps.kendalltau(u, v).statistic)

    point = tau(xa, y) - tau(xb, y) if len(names) >= 2 else math.nan
    rng = np.random.default_rng(seed)
    draws = []
    if len(names) >= 3:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(n_boot):
                idx = rng.integers(0, len(names), len(names))
                d = tau(xa[idx], y[idx]) - tau(xb[idx], y[idx])
                if math.isfinite(d):
                    draws.append(d)
    lo, hi = (float(q) for q in np.quantile(draws, [0.025, 0.975])) if draws else (math.nan, math.nan)
    complete = len(names) == n_all
    verdict = ("PASS" if math.isfinite(lo) and lo > 0 else "MISS") if complete else "INCOMPLETE"
    print(f"{prefix}: delta tau ({a_label} - {b_label}) over {len(names)}/{n_all} candidates = {_num(point)} "
          f"[95% paired bootstrap {_num(lo)}, {_num(hi)}; {len(draws)} resamples] above 0: {verdict}")
    return {"delta": point, "low": lo, "high": hi, "n": len(names), "verdict": verdict}
