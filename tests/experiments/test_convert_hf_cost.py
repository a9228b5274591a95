"""`experiments/convert.py --hf --plan` states its runs and CPU core-hours (issue 37, item 6): the counts are
what `locate_and_repeat` trains, and the FLOPs are each run's tokens x 3 x the forward FLOPs npas
counts for the model that run trains."""

from __future__ import annotations

import re

import pytest

from npas import count, reference_config


@pytest.mark.parametrize("name", ["quick", "full"])
def test_the_plans_runs_and_flops_are_what_the_rate_location_trains(name, capsys):
    from experiments.convert_hf import (
        CPU_FLOPS,
        arm_steps,
        cycle_lora,
        hf_modes,
        locate_and_repeat,
        plan_cost,
        print_hf_plan,
    )

    mode = hf_modes()[name]
    cfg = cycle_lora(mode.chassis)
    cost = plan_cost(mode, cfg)
    dense = mode.dense.steps * mode.dense.tokens_per_step * 3 * count(reference_config(mode.chassis)).flops_per_token

    def spent(loss) -> tuple[int, float]:
        runs, flops = [1], [dense]

        def train(arm, mult, seed):
            runs.append(1)
            flops.append(arm_steps(mode)[arm] * mode.uptrain.tokens_per_step * 3 * count(cfg).flops_per_token)
            return loss(mult)

        locate_and_repeat(mode, train)
        return len(runs), sum(flops)

    import math

    # interior and shallow (x2 within the noise of x1): the whole grid, no extension -- the plan's count
    assert spent(lambda mult: 0.01 * math.log(mult) ** 2) == (cost["runs"], pytest.approx(cost["flops"]))
    steep = spent(lambda mult: math.log(mult) ** 2)  # x2 clearly worse: x4 is not trained, one run less per arm
    assert steep[0] == cost["runs"] - 3 and steep[1] < cost["flops"]
    assert spent(lambda mult: -mult) == (cost["runs_at_most"], pytest.approx(cost["flops_at_most"]))  # edge
    print_hf_plan(mode, cfg)
    m = re.search(r"runs: (\d+) \(at most (\d+)\); .* ~([\d.]+) CPU core-hours", capsys.readouterr().out)
    assert m and (int(m[1]), int(m[2])) == (cost["runs"], cost["runs_at_most"])
    assert float(m[3]) == pytest.approx(cost["flops"] / CPU_FLOPS / 3600, abs=0.006)
    if name == "full":  # issue 37's full run, cut to d_model 64 x 8 and a 2,000-step dense model for the CPU
        # budget (experiments/convert_hf.py's docstring; the d_model 128 plan was ~17.7 core-hours): 28 runs, ~2.5
        # CPU core-hours, still far beyond a helper's 45 core-minutes, so it trains across sessions from its cache
        assert cost["runs"] == 28 and 2 < cost["flops"] / CPU_FLOPS / 3600 < 3
