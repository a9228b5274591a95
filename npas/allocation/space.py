"""Search spaces: where and how parameters may be shared, and sampling from them.

A `Space` is what `npas.allocation.space_parser` builds from a YAML file once every problem in it is
ruled out (`load_space(path)` raises one `SpaceError` listing them all).
`space.sample(trial)` maps an Optuna trial (define-by-run) to a `Candidate`: the knob values, and
the allocation fitted to the budget by construction, or the reason nothing fits. Sampling never
builds a model; it only counts.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import optuna

from npas.allocation.baselines import baselines
from npas.allocation.budget import reference_params
from npas.allocation.budget_scope import BUDGET_SCOPES, below_embeddings, embedding_params, parse_budget
from npas.allocation.config import ArchConfig, AtomSpec, Chassis, ExpertPool
from npas.allocation.fill import FILL_TARGET, FIT_VERSION, grow_pooled, shortfall
from npas.allocation.fit import Fit, expert_pools, fit_banks, fit_experts, fit_width
from npas.allocation.knob_table import (
    CHASSIS_KEYS,
    KNOBS,
    TYING_WITH_U,
    KnobSpec,
    value,
)
from npas.allocation.knobs import Knob
from npas.allocation.layer_maps import Similarity, bank_members, taper_profile, tying_map
from npas.allocation.lora_sharing import knob_fields
from npas.allocation.recursion_allocation import recursion_from_values
from npas.allocation.space_file import LOSS_OBJECTIVES, OBJECTIVES, pin_chassis  # noqa: F401 - objectives re-exported
from npas.errors import BudgetError, ConfigError, NpasError, SampleError, SpaceError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    """A sampled point: its knob values and the fitted allocation (or why none fits)."""

    values: dict[str, Any]
    fit: Fit
    budget: int
    fit_version: int = FIT_VERSION  # which fit made the allocation (npas.allocation.fill), stored with each trial

    @property
    def feasible(self) -> bool:
        return self.fit.config is not None

    @property
    def config(self) -> ArchConfig | None:
        return self.fit.config

    @property
    def reason(self) -> str | None:
        return self.fit.reason

    @property
    def fill(self) -> float:
        """stored / budget: how much of the budget the fitted allocation uses."""
        return self.fit.stored / self.budget if self.feasible else 0.0

    @property
    def short(self) -> str | None:
        """Why this feasible candidate stores under the fill target (None when it does not)."""
        return self.fit.short


@dataclass(frozen=True)
class Space:
    """A validated search space. Plain data plus `sample`; see search_spaces/*.yaml for the format."""

    name: str
    text: str  # the YAML as written, stored in the study so a resume can check it is unchanged
    source: str
    chassis: dict[str, Knob]
    budget_spec: str
    dtype: str
    objectives: tuple[str, ...]
    recipe: str
    knobs: dict[str, Knob]
    width_fit: str = "all"
    max_width_scale: float = 4.0
    max_templates: int = 64
    tying_groups: tuple[tuple[int, ...], ...] | None = None
    bank_groups: tuple[tuple[int, ...], ...] | None = None
    per_position: bool = False
    description: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)  # vocab_size / budget / budget_scope bound at launch
    budget_scope: str = "all"  # all | non_embedding: which stored parameters the budget caps
    # (L, L) similarity of the reference's trained layers, for the learned tying / bank modes. Not in the
    # file and not in `hash`: the study supplies it (npas.service.search.learned) and records it itself.
    similarity: Similarity | None = None
    # the chassis a starting checkpoint fixes (`search --init-from HF_DIR`, see `bind`): every candidate
    # has it, whatever the file's chassis says, and fits its budget by the MLP widths alone (`_width_fit`);
    # its rope_scaling has no knob, so it is carried from here
    pinned: Chassis | None = None

    @property
    def learns_groups(self) -> bool:
        """Some candidate may use `tying.mode: learned` or `pools.rule: learned`, so it needs `similarity`."""
        tying, rule, pools = (self.knobs.get(k) for k in ("tying", "bank_rule", "pools"))
        return bool((tying and "learned" in tying.options())
                    or (rule and "learned" in rule.options() and pools and True in pools.options()))

    def with_similarity(self, sim: Similarity | list[list[float]] | None) -> Space:
        """A copy carrying the layer similarity the learned modes cluster by (one row per reference layer)."""
        if sim is None:
            return replace(self, similarity=None)
        L = self.reference_chassis.n_layers
        rows = tuple(tuple(float(x) for x in row) for row in sim)
        if len(rows) != L or any(len(r) != L for r in rows):
            raise SpaceError(self.source, [f"the layer similarity is {len(rows)} rows, not {L} x {L} (the reference's "
                                           f"depth); learn it from a model of this chassis"])
        return replace(self, similarity=rows)

    # ---- reference and budget ----------------------------------------------------------------
    @property
    def reference_chassis(self) -> Chassis:
        return self._chassis({k: kn.default for k, kn in self.chassis.items()})

    def _chassis(self, dims: dict[str, Any]) -> Chassis:
        """The chassis of these knob values, with the pinned checkpoint's rotary scaling (no knob holds it)."""
        chassis = Chassis(**dims)
        return chassis if self.pinned is None else replace(chassis, rope_scaling=self.pinned.rope_scaling)

    @cached_property
    def reference_params(self) -> int:
        return reference_params(self.reference_chassis)

    @cached_property
    def budget_params(self) -> int:
        """The cap in stored parameters of the budget's scope (relative budgets resolve against the
        reference model counted the same way)."""
        return parse_budget(self.budget_spec, self.reference_params - self._excluded(self.reference_chassis))

    def _excluded(self, chassis: Chassis) -> int:
        """Parameters the budget's scope leaves out: the embeddings under ``non_embedding``."""
        return embedding_params(chassis) if self.budget_scope == "non_embedding" else 0

    def budgeted(self, accounting: Any) -> int:
        """The count the budget caps, from an ``Accounting``: stored or non-embedding parameters."""
        return accounting.non_embedding_params if self.budget_scope == "non_embedding" else accounting.stored_params

    @property
    def hash(self) -> str:
        """Hash of the file text plus launch overrides: what a resume must find unchanged."""
        key = self.text + repr(sorted(self.overrides.items()))
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def bind(self, *, vocab_size: int | None = None, budget: str | None = None,
             budget_scope: str | None = None, chassis: Chassis | Mapping[str, Any] | None = None) -> Space:
        """A copy bound to a corpus vocabulary and/or a budget and its scope given on the command line.

        `chassis` replaces the file's chassis with a starting checkpoint's (`--init-from HF_DIR`): its
        weights fix every dimension, so the file's chassis is only a default, and candidates fit the
        budget by their MLP widths (d_model stays the checkpoint's whatever `fit.width` says). The knobs
        are checked against it as the file's own chassis would be (`space_file.pin_chassis`), and it
        is recorded in `overrides` like the other launch bindings, so a resume and the exporter rebind it."""
        space = self if chassis is None else self._pin(chassis)
        return space._bind(vocab_size, budget, budget_scope)

    def rebind(self, overrides: Mapping[str, Any], vocab_size: int | None = None) -> Space:
        """This space bound as a study's recorded `overrides` say (resume, export, certificate)."""
        return self.bind(vocab_size=vocab_size or overrides.get("vocab_size"), budget=overrides.get("budget"),
                         budget_scope=overrides.get("budget_scope"), chassis=overrides.get("chassis"))

    def _pin(self, chassis: Chassis | Mapping[str, Any]) -> Space:
        ch = chassis if isinstance(chassis, Chassis) else Chassis(**chassis)
        knobs = pin_chassis(self.text, self.source, ch)
        return replace(self, chassis=knobs, pinned=ch, overrides={**self.overrides, "chassis": ch.to_dict()})

    def _bind(self, vocab_size: int | None, budget: str | None, budget_scope: str | None) -> Space:
        chassis, over, spec = dict(self.chassis), dict(self.overrides), self.budget_spec
        scope = self.budget_scope
        if budget_scope is not None:
            if budget_scope not in BUDGET_SCOPES:
                raise BudgetError(f"budget scope {budget_scope!r} is not one of {', '.join(BUDGET_SCOPES)}; "
                                  "use --budget-scope non_embedding to leave the embeddings out of the budget")
            scope = budget_scope
            over["budget_scope"] = budget_scope
        if vocab_size is not None:
            chassis["vocab_size"] = Knob("fixed", values=(int(vocab_size),))
            over["vocab_size"] = int(vocab_size)
        if budget is not None:
            parse_budget(budget, self.reference_params)  # fail now, with the budget's own message
            spec = str(budget)
            over["budget"] = spec
        bound = replace(self, chassis=chassis, budget_spec=spec, overrides=over, budget_scope=scope)
        if scope == "all" and (short := below_embeddings(bound.reference_chassis, spec, bound.budget_params)):
            raise BudgetError(short)
        return bound

    # ---- sampling ----------------------------------------------------------------------------
    def sample(self, trial: optuna.Trial, fixed: dict[str, Any] | None = None) -> Candidate:
        """Define-by-run: suggest each knob that applies (values in `fixed` are used as given).

        Raises only `NpasError`s: `load_space` rejects every space it knows would fail here, and
        anything unforeseen becomes a `SampleError` with its reason, so the caller can FAIL this one
        trial instead of leaving it RUNNING to be re-enqueued and crash again on resume.
        """
        try:
            return self._sample(trial, fixed)
        except NpasError:
            raise
        except Exception as e:  # noqa: BLE001 - the one place an unforeseen failure becomes a typed one
            log.warning("trial %s: sampling failed: %s: %s", getattr(trial, "number", "?"), type(e).__name__, e)
            raise SampleError(f"sampling failed ({type(e).__name__}: {e}); the space allows a value npas cannot "
                              f"build: narrow the knob named above, or report it") from e

    def _sample(self, trial: optuna.Trial, fixed: dict[str, Any] | None) -> Candidate:
        fixed = fixed or {}
        values: dict[str, Any] = {}

        def pick(name: str, spec: KnobSpec) -> None:
            if name in fixed:
                values[name] = fixed[name]
            elif spec.section == "chassis":
                values[name] = self.chassis[spec.name].suggest(trial, name)
            elif spec.name in self.knobs:
                values[name] = self.knobs[spec.name].suggest(trial, name)
            else:
                values[name] = spec.default_for(values)

        for spec in KNOBS:  # the table's order is the sampling order; `applies` reads earlier values
            if not spec.applies(values) or (spec.section == "chassis" and spec.name not in self.chassis):
                continue  # (a family key the space leaves out: the classic default, not recorded)
            if spec.per_layer and self.per_position:
                for i in range(int(values["n_layers"])):
                    pick(f"{spec.name}_{i}", spec)
            else:
                pick(spec.name, spec)
        if "width_fit" in fixed:
            values["width_fit"] = fixed["width_fit"]
        return self.candidate(values)

    def candidate(self, values: dict[str, Any]) -> Candidate:
        """Pure: knob values -> fitted allocation. Same values, same allocation, on any machine."""
        budget = self.budget_params
        try:
            chassis = self._chassis({k: value(values, k) for k in CHASSIS_KEYS})
            problems = chassis.problems()
            if problems:
                return Candidate(values, Fit(None, "; ".join(problems)), budget)
            L = chassis.n_layers
            profile = taper_profile(value(values, "taper"), L, float(value(values, "taper_ratio")))
            groups = [list(g) for g in self.tying_groups] if self.tying_groups else None
            tying = value(values, "tying")
            unique = int(value(values, "unique_blocks")) if tying in TYING_WITH_U else 1
            blocks = tying_map(tying, L, unique, groups, self.similarity)
        except ValueError as e:
            return Candidate(values, Fit(None, str(e)), budget)
        shared = [blocks.count(b) > 1 for b in blocks]
        targets = value(values, "lora_targets")
        rank = int(value(values, "lora_rank"))
        ranks = [int(values.get(f"lora_rank_{i}", rank) or 0) if shared[i] else 0 for i in range(L)]
        lora_attn = tuple(r if targets in ("attn", "both") else 0 for r in ranks)
        lora_mlp = tuple(r if targets in ("mlp", "both") else 0 for r in ranks)
        sharing = knob_fields(value(values, "lora_sharing"), int(value(values, "lora_seed")),
                              float(value(values, "lora_shard_fraction")),
                              float(value(values, "lora_private_fraction")), ranks)
        g = int(value(values, "kv_group"))
        if not 1 <= g <= L:
            return Candidate(values, Fit(None, f"kv_sharing.group={g} must be 1..n_layers={L}"), budget)
        kv_source = tuple(i // g * g for i in range(L))  # groups of g adjacent layers read the first's K/V
        atom_letters = value(values, "atom_slots")
        atoms = () if atom_letters == "none" else tuple(
            AtomSpec(f"attn_{c}", int(value(values, "n_atoms")), value(values, "atom_scope")) for c in atom_letters)

        def make(ch: Chassis, widths: tuple[int, ...], experts: ExpertPool | None = None) -> ArchConfig:
            return ArchConfig(chassis=ch, mlp_widths=widths, block_of_layer=blocks, lora_attn=lora_attn,
                              lora_mlp=lora_mlp if experts is None else (0,) * L, lora_alpha=float(value(values, "lora_alpha")),
                              lora_scaling=value(values, "lora_scaling"), untied_norms=bool(value(values, "untied_norms")),
                              dtype=self.dtype, kv_source=kv_source, kv_mode=value(values, "kv_mode"), atoms=atoms,
                              experts=experts, **sharing)

        if int(value(values, "experts_per_layer")) > 0:
            return self._experts_candidate(values, chassis, make, budget)
        if int(value(values, "recursion_steps")) > 0:
            return self._recursion_candidate(values, chassis, budget)

        if not value(values, "pools"):
            fit = fit_width(make, chassis, profile, budget, self._width_fit(values),
                            self.max_width_scale, self.budget_scope)
            return self._filled(values, fit, budget)
        base = make(chassis, tuple(max(1, round(chassis.d_ff * p)) for p in profile))
        try:
            groups = [list(g) for g in self.bank_groups] if self.bank_groups else None
            members = bank_members(base, value(values, "bank_rule"), int(value(values, "n_banks")), groups,
                                   self.similarity)
        except ValueError as e:
            return Candidate(values, Fit(None, str(e)), budget)
        excluded = self._excluded(chassis)  # pools keep d_model: the scope shifts the cap by a constant
        fit = fit_banks(base, members, value(values, "generator"), budget + excluded, int(value(values, "templates")),
                        self.max_templates, floor=math.ceil(FILL_TARGET * budget) + excluded,
                        tile=int(value(values, "hash_tile")), seed=int(value(values, "hash_seed")))
        fit = grow_pooled(fit, [chassis.d_ff * p for p in profile], budget + excluded, self.max_width_scale)
        if excluded and fit.config is not None:
            fit = replace(fit, stored=fit.stored - excluded)
        return self._filled(values, fit, budget)

    def _filled(self, values: dict[str, Any], fit: Fit, budget: int) -> Candidate:
        """The candidate, with why it stores under the fill target when its shapes cannot reach it."""
        return Candidate(values, replace(fit, short=shortfall(fit, budget, self.max_width_scale)), budget)

    def _width_fit(self, values: dict[str, Any]) -> str:
        """How a fit may scale widths: the candidate's own (`narrow_untied` narrows d_model), else the
        space's; only the MLP under a pinned chassis, whose d_model the starting checkpoint fixes (its
        weights convert to its own residual width: rotary pairs and grouped heads do not narrow)."""
        return "mlp" if self.pinned is not None else values.get("width_fit", self.width_fit)

    def _experts_candidate(self, values: dict[str, Any], chassis: Chassis, make: Any, budget: int) -> Candidate:
        """The MLP as pooled experts; the fit solves the expert width. Shapeshifter banks would pool
        the same MLP weights a second way, so that combination is refused (attention-only banks
        would be a later extension); MLP LoRA has no dense MLP to relax and is dropped."""
        if value(values, "pools"):
            return Candidate(values, Fit(None, "expert pools and parameter banks (pools.enabled) both pool the "
                                               "MLP; enable one of them"), budget)
        L = chassis.n_layers
        window = L if value(values, "expert_scope") == "global" else int(value(values, "expert_window"))
        if not 1 <= window <= L:
            return Candidate(values, Fit(None, f"experts.window={window} must be 1..n_layers={L}"), budget)
        k = int(value(values, "experts_topk"))
        sizes, pool_of_layer = expert_pools(L, window, int(value(values, "experts_per_layer")),
                                            float(value(values, "expert_pool_fraction")), k)

        def make_experts(ch: Chassis, d_expert: int) -> ArchConfig:
            pool = ExpertPool(sizes, pool_of_layer, d_expert, k, value(values, "expert_router"),
                              float(value(values, "expert_balance")))
            return make(ch, (1,) * L, pool)  # experts take no MLP LoRA: make drops it

        fit = fit_experts(make_experts, chassis, budget, self._width_fit(values), self.max_width_scale,
                          self.budget_scope)
        return self._filled(values, fit, budget)

    def _recursion_candidate(self, values: dict[str, Any], chassis: Chassis, budget: int) -> Candidate:
        """A shared stack run up to N_r times per token (npas.allocation.recursion): the spec fixes the
        depth, the tying map and the KV sources, so tying, KV sharing and atoms must be left off; the
        fit solves the widths as for any dense model."""
        if value(values, "tying") != "none" or int(value(values, "kv_group")) > 1 or value(values, "atom_slots") != "none":
            return Candidate(values, Fit(None, "recursion sets the tying and the KV sources itself; leave tying.mode "
                                               "none, kv_sharing.group 1 and atoms.slots none"), budget)
        spec = recursion_from_values(values)
        ch = replace(chassis, n_layers=spec.n_layers)
        profile = taper_profile(value(values, "taper"), spec.n_layers, float(value(values, "taper_ratio")))

        def make(c: Chassis, widths: tuple[int, ...]) -> ArchConfig:
            return ArchConfig(chassis=c, mlp_widths=widths, block_of_layer=spec.block_of_layer(),
                              kv_source=spec.kv_source(), dtype=self.dtype, recursion=spec)

        try:
            fit = fit_width(make, ch, profile, budget, self._width_fit(values), self.max_width_scale, self.budget_scope)
        except ConfigError as e:
            return Candidate(values, Fit(None, str(e)), budget)
        return self._filled(values, fit, budget)

    def baselines(self) -> dict[str, dict[str, Any]]:
        """Knob values of the hand-crafted baselines (`npas.allocation.baselines`), completed for this
        space's depth and each fitted on its reference chassis."""
        chassis = {name: knob.default for name, knob in self.chassis.items()}
        return baselines(self.knobs, self.reference_chassis.n_layers, self.per_position, self.width_fit,
                         lambda vals: self.candidate({**chassis, **vals}).config)
