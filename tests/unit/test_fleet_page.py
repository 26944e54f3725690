"""The fleet's drift page (hookwatch._drift.fleet): its arithmetic against the promtool case,
and the committed simulation (docs/fleet-sim.json, docs/drift.md's block)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from dev import fleet_sim
from hookwatch._drift import BinnedReference
from hookwatch._drift.fleet import FLEET_REFERENCE_DELTA, FleetPageTest, chi_square_tail
from hookwatch._drift.sequential import reference_tolerance


def _two_bins() -> BinnedReference:
    return BinnedReference(
        "confidence",
        "prediction",
        np.array([[0.5]]),
        np.array([[50, 50]]),
        np.zeros((1, 1), dtype=np.uint8),
    )


def test_the_page_ratio_is_the_promtool_cases() -> None:
    # monitoring/prometheus/tests/hookwatch-alerts-test.yml, "drift pages on the fleet's
    # merged bin counts": 11,000 and 1,000 samples in 10 minutes, a 30-day budget.
    test = FleetPageTest([_two_bins()], [np.array([0])], 30 * 86400.0)
    ratio = test.ratios([np.array([[11_000, 1_000]])])[0][0]
    assert ratio == pytest.approx(1.9058267757719993, rel=1e-12)
    # By hand: distance over tolerance plus noise.
    x, y = math.log(1 / FLEET_REFERENCE_DELTA), math.log(30 * 86400.0)
    b = math.sqrt(float(chi_square_tail(1.0, x)) / 100)
    assert b == pytest.approx(float(reference_tolerance(np.array([2]), 100, x)[0]))
    distance = math.sqrt(2 * (11 / 12 - 0.5) ** 2 / 0.5)
    assert ratio == pytest.approx(
        distance / (b + math.sqrt(float(chi_square_tail(1.0, y)) / 12000))
    )
    # Balanced traffic: distance 0; no samples: no verdict; too few samples: no page.
    balanced, empty = test.ratios([np.array([[[500, 500]], [[0, 0]]])])[0]
    assert balanced[0] == 0 and math.isnan(empty[0])
    assert not test.pages([np.array([[[90, 0]]])], min_samples=100)[0]
    assert test.pages([np.array([[[11_000, 1_000]]])], min_samples=100)[0]


def test_the_budget_enters_only_through_its_log() -> None:
    ref = _two_bins()
    short = FleetPageTest([ref], [np.array([0])], 3600.0)
    long = FleetPageTest([ref], [np.array([0])], 365 * 86400.0)
    counts = [np.array([[7_000, 5_000]])]
    assert short.ratios(counts)[0][0] > long.ratios(counts)[0][0]
    with pytest.raises(ValueError, match="page budget"):
        FleetPageTest([ref], [np.array([0])], 0.0)


def test_a_short_simulation_runs_on_the_real_classes() -> None:
    rng = np.random.default_rng(3)
    fleet = fleet_sim.Fleet(rng, 2000, 30.0)
    assert fleet.test.features == sum(fleet_sim.DETECTOR_FEATURES)
    clean = fleet_sim.run_fleet(rng, fleet, 100, 10.0, 0.05)
    assert clean["evaluations"] == int(0.05 * 86400 / 15) and clean["pages"] == 0
    shifted = fleet_sim.run_fleet(rng, fleet, 100, 10.0, 1.1, shift=(0.1, 3.0, (5,)))
    assert shifted["pages_before_shift"] == 0 and shifted["delay_s"] is not None


def test_the_committed_block_is_the_committed_results_rendered() -> None:
    results: dict[str, Any] = json.loads(fleet_sim.RESULTS.read_text())
    text = fleet_sim.DOC.read_text()
    assert fleet_sim.rewrite(text, fleet_sim.render(results)) == text, (
        "docs/drift.md's fleet-sim block is stale or edited by hand: run "
        "`python -m dev.fleet_sim --render`"
    )


def test_the_committed_results_hold_the_budget_and_page_on_the_shifts() -> None:
    results: dict[str, Any] = json.loads(fleet_sim.RESULTS.read_text())
    assert results["clean_days"] >= 100 and len(results["clean"]) >= 5
    assert all(p["workers"] == 100 for p in results["clean"])
    assert results["clean_pages"] <= results["allowed_pages"]
    for point in results["sizes"]:
        assert point["pages"] <= max(1.0, point["days"] / results["budget_days"])
    stress = results["stress"]
    assert stress["pages"] <= stress["allowed_pages"]
    assert all(p["pages_before_shift"] == 0 for p in results["shifts"])
    assert all(p["delay_s"] is not None for p in results["shifts"])
    assert results["cpu_s"] < 300
