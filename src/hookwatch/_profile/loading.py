"""Loading a model's drift profile at serving time, into a calibrated tracker."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from hookwatch._config import MonitoringConfig
from hookwatch._drift import AccuracyTracker, DriftTracker
from hookwatch._profile.format import DriftProfile

__all__ = ["load_tracker", "serving_tracker", "tracker_for"]

log = logging.getLogger("hookwatch")


def load_tracker(
    config: MonitoringConfig, model_dir: str | Path | None, model_name: str
) -> DriftTracker | None:
    """The drift tracker for a model directory, or None (and one log line) when there is none.

    A missing profile is not an error: the model serves without drift signals and
    ``hookwatch_drift_profile_loaded`` says so. A profile that does not fit the configuration
    is one, so a wrong file never produces silently meaningless scores.
    """
    drift = config.drift
    if not (config.enabled and drift.enabled):
        log.info("hookwatch: drift detection is off for model %r (configuration)", model_name)
        return None
    path = Path(model_dir) / drift.profile if model_dir is not None else None
    if path is None or not path.is_file():
        log.warning(
            "hookwatch: model %r has no drift profile (expected %s); serving without drift "
            "detection. Build one with `hookwatch profile` and add it to the .mar",
            model_name,
            path if path is not None else f"<model_dir>/{drift.profile}",
        )
        return None
    return tracker_for(DriftProfile.load(path), config, model_name)


def serving_tracker(
    config: MonitoringConfig, model_dir: str | Path | None, model_name: str
) -> tuple[DriftTracker | None, bool]:
    """:func:`load_tracker` for a serving worker, which never fails the model's load over its
    profile: the tracker, or None and whether that is a fault (a profile that is there but
    cannot be used: corrupt, truncated, another format version, for other layers).

    A fault is logged here, once per load, and the monitor counts it in
    ``hookwatch_monitor_faults_total{layer="all"}``; ``hookwatch_drift_profile_loaded`` is 0
    either way. Drift verdicts from a profile that does not fit would be meaningless, so there
    are none; the model serves as it would without a profile.
    """
    try:
        return load_tracker(config, model_dir, model_name), False
    except Exception as error:
        # Anything: np.load on a damaged zip raises half a dozen types, calibration may run
        # out of memory. None of it is a reason to stop serving.
        log.error(
            "hookwatch: the drift profile of model %r could not be used (%s: %s); serving "
            "without drift detection (hookwatch_drift_profile_loaded 0). Rebuild it with "
            "`hookwatch profile` or `hookwatch archive`",
            model_name,
            type(error).__name__,
            str(error)[:300],
        )
        return None, True


def tracker_for(profile: DriftProfile, config: MonitoringConfig, model_name: str) -> DriftTracker:
    """A tracker over ``profile``, calibrated for ``config.drift``; fails when they do not fit."""
    drift = config.drift
    started = time.perf_counter()
    profile.check(config)
    tracker = profile.tracker(
        drift.window,
        drift.effective_step,
        drift.false_alarm_rate,
        drift.calibration_windows,
        seed=config.seed or 0,
        run_length=drift.run_length if drift.sequential else None,
        reference_confidence=drift.reference_confidence,
    )
    for detector, reason in profile.left_out.items():
        log.warning(
            "hookwatch: drift detector %r of model %r was left out of its profile (%s); it "
            "never alarms (hookwatch_drift_detector_usable 0)",
            detector,
            model_name,
            reason,
        )
    tracker.accuracy = _accuracy(profile, config, model_name)
    log.info(
        "hookwatch: drift profile of model %r loaded (%d detectors, window %d, false alarm "
        "rate %g, calibrated in %.1f s)",
        model_name,
        len(profile.references),
        drift.window,
        drift.false_alarm_rate,
        time.perf_counter() - started,
    )
    return tracker


def _accuracy(
    profile: DriftProfile, config: MonitoringConfig, model_name: str
) -> AccuracyTracker | None:
    """The accuracy estimate of a profile built with reference labels, or None, said once."""
    harm, estimator, layer = config.harm, profile.accuracy, profile.accuracy_layer
    if estimator is None or layer is None:
        log.info(
            "hookwatch: model %r has no accuracy estimate (%s); it pages on drift "
            "(HookwatchDrift). Archive it with --reference-labels for an estimate and pages on "
            "harm",
            model_name,
            "its output head is not logits"
            if config.output.head != "logits"
            else "its profile was built without reference labels",
        )
        return None
    if not harm.enabled:
        log.info(
            "hookwatch: the accuracy estimate of model %r is off (monitoring.harm.enabled); it "
            "pages on drift (HookwatchDrift)",
            model_name,
        )
        return None
    if layer not in config.watched:
        # profile.check matched the layers already; a profile written by hand could differ.
        log.warning(
            "hookwatch: the accuracy estimate of model %r reads layer %r, which is not watched; "
            "no estimate, it pages on drift (HookwatchDrift)",
            model_name,
            layer,
        )
        return None
    log.info(
        "hookwatch: accuracy of model %r estimated without labels from layer %r (reference "
        "accuracy %.3f, k = %d); it pages when the estimate falls %.3f below it",
        model_name,
        layer,
        estimator.reference_accuracy,
        estimator.k,
        harm.max_drop,
    )
    return AccuracyTracker(
        estimator,
        layer,
        window=config.drift.window,
        max_drop=harm.max_drop,
        run_length=harm.run_length,
    )
