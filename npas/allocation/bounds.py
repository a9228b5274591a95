"""Whether a budget can hold anything a space allows, decided before a study exists.

A search whose every sampled candidate is infeasible runs its baselines, draws candidate after
candidate, stops when `SKIPS_BEFORE_EXHAUSTED` in a row did not fit, and leaves a study that learnt
nothing. `check_reachable` refuses such a budget before the database or Ray is touched, in two steps:

1. `smallest_params`, an analytic lower bound on what the space's smallest non-baseline candidate
   stores, from the knobs' ranges alone (narrowest widths, fewest blocks, banks and K/V sources the
   knobs allow); it never builds or fits a candidate, so it holds whatever the fit does inside those
   ranges, and a budget below it is refused with the bound in the message;
2. otherwise a seeded draw of `SKIPS_BEFORE_EXHAUSTED` candidates at random, the way the search itself
   starts and falls back when stuck (`probe`): a budget none of them fits would stop the search
   exactly so, and is refused the same way.

Both say whether the baselines alone would fit: a study of baselines only compares nothing.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import optuna

from npas.allocation.budget_scope import embedding_params
from npas.allocation.config import ATTN_SLOTS, Chassis
from npas.allocation.knob_table import BY_NAME, CHASSIS_KEYS, TYING_WITH_U
from npas.errors import BudgetError, NpasError

if TYPE_CHECKING:
    from npas.allocation.space import Space

SKIPS_BEFORE_EXHAUSTED = 200  # infeasible or duplicate asks in a row before a search calls its space exhausted
MAX_CHASSIS = 4096  # chassis combinations the bound walks; a space searching more gets no analytic bound
_MONOTONE = ("vocab_size", "context", "d_ff")  # stored params never fall as these grow (d_ff: widths reach 1 anyway)


def _options(space: Space, name: str) -> list[Any] | None:
    """The values a knob can take, or None when it keeps its table default (which may depend on others)."""
    knob = space.knobs.get(name)
    return None if knob is None else knob.options()


def _chassis_choices(space: Space) -> list[Chassis] | None:
    """Every chassis the space's chassis knobs allow and that builds (the monotone dimensions at their
    least); None when there are more than MAX_CHASSIS."""
    axes = []
    for key in CHASSIS_KEYS:
        knob = space.chassis.get(key)
        values = [BY_NAME[key].default] if knob is None else knob.options()
        axes.append([min(values)] if key in _MONOTONE else values)
    if math.prod(len(a) for a in axes) > MAX_CHASSIS:
        return None
    out = []
    for combo in itertools.product(*axes):
        try:
            chassis = Chassis(**dict(zip(CHASSIS_KEYS, combo, strict=True)))
        except (TypeError, ValueError):
            continue
        if not chassis.problems():
            out.append(chassis)
    return out


def _fewest_blocks(space: Space, n_layers: int) -> int | None:
    """The fewest unique blocks a tying mode of the space gives at this depth; None if none builds."""
    fewest = None
    for mode in _options(space, "tying") or ["none"]:
        if mode == "none":
            blocks = n_layers
        elif mode in ("all", "explicit"):  # explicit: its groups could all be one block, as far as a bound knows
            blocks = 1
        else:
            us = _options(space, "unique_blocks") or [BY_NAME["unique_blocks"].default_for(
                {"tying": mode, "n_layers": n_layers})]
            us = [u for u in us if 1 <= u <= n_layers and (mode != "middle_loop" or (u >= 3 and n_layers >= 3))]
            if not us:
                continue
            u = min(us)  # middle_loop loops over at most the L - 2 inner layers
            blocks = 2 + min(u - 2, n_layers - 2) if mode == "middle_loop" else u
        assert mode == "none" or mode in TYING_WITH_U or mode in ("all", "explicit")
        fewest = blocks if fewest is None else min(fewest, blocks)
    return fewest


def _narrowest(chassis: Chassis) -> Chassis:
    """The narrowest d_model the `all` width fit steps down to (by `width_step`, staying above 0)."""
    step = chassis.width_step
    dm = (chassis.d_model - 1) % step + 1
    return replace(chassis, d_model=dm, d_ff=max(1, round(chassis.d_ff * dm / chassis.d_model)))


def _floor(space: Space, ch: Chassis, blocks: int, pooled: bool) -> int:
    """Least params a candidate on `ch` with at least `blocks` blocks stores, in the budget's scope.

    Counted as `stored_params` counts, each part at its least: embeddings and the final norm as they
    are; a norm pair per layer (or per block where `untied_norms` may be false); with pools, every slot
    may be banked into a bank of one parameter (0 here); else each attention slot per block, once in
    all where atoms or K/V sharing may replace its copies; each MLP one unit wide per block, or one
    expert of width 1."""
    d = ch.d_model
    total = 0 if space.budget_scope == "non_embedding" else embedding_params(ch)
    pairs = blocks if False in (_options(space, "untied_norms") or [True]) else ch.n_layers
    total += d + 2 * d * pairs
    if pooled:
        return total
    letters = {c for option in _options(space, "atom_slots") or [] if option != "none" for c in option}
    kv_shared = max(_options(space, "kv_group") or [1]) > 1
    keys_shared = kv_shared and "kv" in (_options(space, "kv_mode") or ["kv"])
    for slot in ATTN_SLOTS:
        once = slot[-1] in letters or (slot == "attn_v" and kv_shared) or (slot == "attn_k" and keys_shared)
        total += math.prod(ch.slot_shape(slot, 1)) * (1 if once else blocks)
    n_mlp = 3 if ch.activation == "swiglu" else 2
    experts = max(_options(space, "experts_per_layer") or [0]) > 0
    return total + n_mlp * d * (1 if experts else blocks)


def smallest_params(space: Space) -> int | None:
    """A lower bound on the budgeted params of every candidate `space.sample` can draw (baselines
    aside: they fix their own widths); None when the space searches too many chassis to walk."""
    choices = _chassis_choices(space)
    if not choices:
        return None
    narrows = space.pinned is None and space.width_fit == "all"  # a pinned chassis fits by the MLP alone
    pools = True in (_options(space, "pools") or [False])
    best = None
    for ch in choices:
        blocks = _fewest_blocks(space, ch.n_layers)
        if blocks is None:
            continue
        floors = [_floor(space, _narrowest(ch) if narrows else ch, blocks, pooled=False)]
        if pools:  # banks keep the chassis' d_model
            floors.append(_floor(space, ch, blocks, pooled=True))
        best = min(floors) if best is None else min(best, *floors)
    return best


def baselines_that_fit(space: Space) -> list[str]:
    """The hand-crafted baselines whose allocation fits the budget (on the reference chassis)."""
    chassis = {name: knob.default for name, knob in space.chassis.items()}
    return [name for name, values in space.baselines().items() if space.candidate({**chassis, **values}).feasible]


def probe(space: Space, seed: int, draws: int = SKIPS_BEFORE_EXHAUSTED) -> tuple[bool, str | None]:
    """(whether some of `draws` seeded random candidates fits, the first reason one did not).

    A draw with a learned tying or bank rule counts as fitting while the space has no similarity yet:
    its groups, and so its widths, are only known once the study has learnt them."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))  # in memory: nothing written
    reason = None
    for _ in range(draws):
        trial = study.ask()
        try:
            cand = space.sample(trial)
        except NpasError as e:  # the search fails such a draw and goes on
            reason = reason or str(e)
            continue
        finally:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        if cand.feasible:
            return True, None
        v = cand.values
        if space.similarity is None and (v.get("tying") == "learned" or (v.get("pools") and v.get("bank_rule") == "learned")):
            return True, None
        reason = reason or cand.reason
    return False, reason


def check_reachable(space: Space, seed: int = 0) -> None:
    """Refuse, in one `BudgetError` line, a budget that no candidate of `space` fits (see the module)."""
    budget = space.budget_params
    floor = smallest_params(space)
    fit = baselines_that_fit
    if floor is not None and floor > budget:
        raise BudgetError(f"budget {space.budget_spec} is {budget:,} params, but the smallest candidate space "
                          f"{space.name!r} allows (the narrowest widths and fewest blocks its knobs permit) stores at "
                          f"least {floor:,}; {_baselines(fit(space))}: raise the budget to at least {floor:,}, or "
                          f"widen the space (fit.width: all, tying, pools)")
    found, reason = probe(space, seed)
    if not found:
        why = f" (e.g. {reason.split(';')[0]})" if reason else ""
        raise BudgetError(f"none of {SKIPS_BEFORE_EXHAUSTED} candidates drawn at random from space {space.name!r} "
                          f"fits budget {space.budget_spec} ({budget:,} params){why}, so the search would stop "
                          f"with nothing found; {_baselines(fit(space))}: raise the budget or widen the space")


def _baselines(fitting: list[str]) -> str:
    if not fitting:
        return "not even the baselines fit"
    return f"only the baseline(s) {', '.join(fitting)} would fit, and baselines alone compare nothing"
