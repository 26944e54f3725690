"""``make eval-drift``: hookwatch's drift detection measured through its own path, against
alibi-detect's tests given the same information, over several draws. Writes
``docs/eval-drift.md`` and the numbers behind it, ``docs/eval-drift.json``.

Everything runs in process (model, serving hooks, the saved profile, the worker's tracker; no
TorchServe). Each draw (seed) splits the digits anew, trains the demo CNN as ``make mar`` does,
builds and saves the profile from its held-out reference, and shifts its test digits into the
scenarios. Baselines run in ``.venv-eval`` (``baselines.py``), in two processes beside the
hookwatch measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dev.evaluation import report
from dev.evaluation.draws import Draw, make_draw, with_budget
from dev.evaluation.protocol import (
    FULL,
    JUDGEMENTS,
    Windows,
    any_verdict,
    calibrated,
    clean_windows,
    make_windows,
    stream_verdicts,
    variants,
)
from dev.evaluation.significance import compare, interval
from dev.evaluation.timeline import (
    clean_run,
    delays,
    null_reference,
    online_streams,
    tracker,
)
from hookwatch._config import DriftConfig, MonitoringConfig, read_model_config

#: The repository this harness evaluates: dev/evaluation/run.py is 2 levels in.
ROOT = Path(__file__).resolve().parents[2]
PENULTIMATE = "act3"
#: Baseline methods: (key in the baseline output, table name).
ENSEMBLES = (("ks_or", "KS-OR"), ("mmd_or", "MMD-OR"))
#: A shift is harmful when the model's accuracy drops by at least this much (share).
HARMFUL_DROP = 0.02
#: Sampled requests per second behind the simulated days: 100 requests/s at 10 % sampling.
SAMPLED_PER_SECOND = 10
#: The wide-layer comparison: a feature budget below the widths of the input and act2/act3.
WIDE_BUDGET = 16
WIDE_LEVELS = ("input", "activation")
#: Run lengths at which the anytime-valid guarantee is checked on counted false alarms.
RUN_LENGTH_CHECKS = (1_000, 10_000)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "eval-drift.md")
    parser.add_argument("--baseline-python", default=str(ROOT / ".venv-eval" / "bin" / "python"))
    parser.add_argument("--seeds", type=int, default=5, help="draws: splits, models, references")
    parser.add_argument("--windows", type=int, nargs="+", default=[50, 100, 200])
    parser.add_argument("--streams", type=int, default=4, help="streams per scenario and draw")
    parser.add_argument("--clean-windows", type=int, default=100, help="per draw and W, all")
    parser.add_argument("--hookwatch-clean-windows", type=int, default=1000)
    parser.add_argument("--calibration-windows", type=int, default=4000)
    parser.add_argument("--permutations", type=int, default=100)
    parser.add_argument("--days", type=float, default=6.0, help="simulated days per draw")
    parser.add_argument("--check-samples", type=int, default=200_000)
    parser.add_argument("--online-streams", type=int, default=2)
    parser.add_argument("--online-prefix", type=int, default=200)
    parser.add_argument("--online-length", type=int, default=2000)
    parser.add_argument("--online-clean", type=int, default=20_000)
    parser.add_argument("--ert", type=int, default=1000, help="run length of the online table")
    parser.add_argument("--online-window", type=int, default=50)
    parser.add_argument("--no-wide", action="store_true", help="skip the wide-layer section")
    parser.add_argument(
        "--render", type=Path, help="only rewrite the markdown from this results .json"
    )
    parser.add_argument(
        "--only-wide",
        type=Path,
        default=None,
        help="only the wide-layer section (draw 0), into this results .json and --out",
    )
    return parser


def _draw_windows(draw: Draw, args: argparse.Namespace) -> dict[int, Windows]:
    """The judged windows of a draw at every W, drawn from its seed (the full run and
    ``--only-wide`` alike)."""
    rng = np.random.default_rng(draw.seed)
    return {w: make_windows(draw, w, args.streams, args.clean_windows, rng) for w in args.windows}


def _only_wide(args: argparse.Namespace, config: MonitoringConfig) -> int:
    """The wide-layer section alone, on the draw and windows the full run makes for draw 0,
    put into the committed results in place of its own (the rest of them unchanged)."""
    started = time.perf_counter()
    results = json.loads(args.only_wide.read_text())
    draw = make_draw(0, config)
    windows = _draw_windows(draw, args)
    wide = report.wide_summary(_wide(draw, windows, args), draw, windows, args.windows)
    wide["rerun"] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seconds": time.perf_counter() - started,
    }
    results["wide"] = wide
    args.only_wide.write_text(json.dumps(results, indent=1, default=float) + "\n")
    args.out.write_text(report.markdown(results) + "\n")
    _rewrite_readme(args.out, results)
    print(f"wrote the wide-layer section of {args.out} in {wide['rerun']['seconds']:.0f} s")
    return 0


# ---------------------------------------------------------------------------- baselines


def _jobs(
    draw: Draw, windows: Mapping[int, Windows], args: argparse.Namespace, workdir: Path
) -> list[tuple[Path, float]]:
    """The draw's baseline jobs and their rough costs (seconds here, for sharing them out)."""
    reps = list(draw.reps)
    common: dict[str, Any] = {"seed": np.int64(draw.seed), "p_val": np.float64(0.01)}
    payload: dict[str, Any] = {
        **common,
        "kind": "windows",
        "reps": np.array(reps),
        "permutations": np.int64(args.permutations),
    }
    for rep in reps:
        payload[f"ref_{rep}"] = draw.ref_reps[rep]
        payload[f"pool_{rep}"] = draw.reps[rep]
    cost = 0.0
    for w, win in windows.items():
        judged = win.judged()
        payload[f"windows_{w}"] = judged
        cost += len(judged) * (0.08 + 0.0002 * w)
    jobs = [(workdir / f"windows-{draw.seed}.npz", cost)]
    np.savez(jobs[0][0], **payload)
    streams = online_streams(
        draw, args.online_prefix, args.online_length, args.online_streams, draw.seed
    )
    rng = np.random.default_rng(draw.seed + 7)
    online = {
        **common,
        "kind": "online",
        "ert": np.float64(args.ert),
        "window": np.int64(args.online_window),
        # alibi-detect asks for bootstraps well beyond the run time; the CVM detector's
        # per-feature level is 1/ert over the softmax's 10 features.
        "cvm_bootstraps": np.int64(20 * args.ert),
        "mmd_bootstraps": np.int64(10 * args.ert),
        "prefix": np.int64(args.online_prefix),
        "streams": np.concatenate(list(streams.values())),
        "clean": rng.choice(draw.pool("clean"), args.online_clean),
        "ref_output": draw.ref_reps["output"],
        "pool_output": draw.reps["output"],
        "ref_penultimate": draw.ref_reps[PENULTIMATE],
        "pool_penultimate": draw.reps[PENULTIMATE],
    }
    path = workdir / f"online-{draw.seed}.npz"
    np.savez(path, **online)
    jobs.append((path, 60.0))
    return jobs


def _start_baselines(jobs: list[tuple[Path, float]], python: str) -> list[subprocess.Popen[bytes]]:
    """Two processes (one per core), jobs shared out by cost, each one thread."""
    shards: list[list[Path]] = [[], []]
    loads = [0.0, 0.0]
    for path, cost in sorted(jobs, key=lambda j: -j[1]):
        i = loads.index(min(loads))
        shards[i].append(path)
        loads[i] += cost
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    script = Path(__file__).with_name("baselines.py")
    return [
        subprocess.Popen([python, str(script), *map(str, shard)], env=env)
        for shard in shards
        if shard
    ]


# ---------------------------------------------------------------------------- hookwatch


def _rates(verdicts: NDArray[np.bool_]) -> NDArray[np.float64]:
    """Per stream, the share of its fully shifted judgements that alarmed."""
    rates: NDArray[np.float64] = np.asarray(
        verdicts.reshape(-1, JUDGEMENTS)[:, FULL].mean(axis=1), dtype=np.float64
    )
    return rates


def _first(verdicts: NDArray[np.bool_], step: int) -> NDArray[np.float64]:
    """Per stream, shifted requests until the first alarm (inf: none in 2W)."""
    rows = verdicts.reshape(-1, JUDGEMENTS)
    at: NDArray[np.float64] = step * (rows.argmax(axis=1) + 1).astype(np.float64)
    at[~rows.any(axis=1)] = np.inf
    return at


HookwatchCells = dict[tuple[str, int], dict[str, Any]]


def _hookwatch_cells(
    draw: Draw, windows: Mapping[int, Windows], args: argparse.Namespace
) -> HookwatchCells:
    """Per variant and W: verdicts on every judged window (streams, then clean windows), and
    the alarm share on the extra clean windows, all through the tracker."""
    far = draw.config.drift.false_alarm_rate
    out: HookwatchCells = {}
    for variant in variants(draw.profile, PENULTIMATE):
        for w, win in windows.items():
            started = time.perf_counter()
            calibration = calibrated(draw.profile, variant, w, far, args.calibration_windows)
            calibration_s = time.perf_counter() - started
            judged: list[NDArray[np.bool_]] = []
            for streams in win.streams.values():
                for stream in streams:
                    v = stream_verdicts(
                        draw.profile, variant.detectors, calibration, draw.raw, stream, win.step
                    )
                    # The first verdict judges the clean prefix; the next 8 are the judgements.
                    judged.append(any_verdict(v)[1 : 1 + JUDGEMENTS])
            # One window per verdict: the concatenated clean windows judged every W samples.
            clean = stream_verdicts(
                draw.profile, variant.detectors, calibration, draw.raw, win.clean.ravel(), w
            )
            judged.append(any_verdict(clean))
            extra = clean_windows(
                draw, w, args.hookwatch_clean_windows, np.random.default_rng(draw.seed + 99 * w)
            )
            more = stream_verdicts(
                draw.profile, variant.detectors, calibration, draw.raw, extra.ravel(), w
            )
            out[variant.name, w] = {
                "verdicts": np.concatenate(judged),
                "clean_extra": float(any_verdict(more).mean()),
                "per_detector_level": calibration.per_detector_rate,
                "calibration_s": calibration_s,
            }
    return out


def _timeline(draw: Draw, args: argparse.Namespace) -> dict[str, Any]:
    """Simulated days at the library defaults, run-length checks, and detection delays."""
    defaults = DriftConfig()
    window, step = defaults.window, defaults.effective_step
    started = time.perf_counter()
    null, raw = null_reference(draw, seed=draw.seed + 17)
    pool = np.arange(len(next(iter(raw.values()))))
    null_calibration = null.calibrate(
        window, defaults.false_alarm_rate, defaults.calibration_windows, 0
    )
    per_day = SAMPLED_PER_SECOND * 86_400
    trackers = {"defaults": tracker(null, null_calibration, step, defaults.run_length, window)}
    samples = {"defaults": round(args.days * per_day)}
    for run_length in RUN_LENGTH_CHECKS:
        name = f"run length {run_length}"
        trackers[name] = tracker(null, null_calibration, step, run_length, window)
        samples[name] = args.check_samples
    runs = clean_run(raw, pool, trackers, samples, seed=draw.seed + 31)
    days_s = time.perf_counter() - started
    calibration = draw.profile.calibrate(
        window, defaults.false_alarm_rate, defaults.calibration_windows, 0
    )
    streams = online_streams(
        draw, args.online_prefix, args.online_length, args.online_streams, draw.seed
    )
    window_delays, shipped = delays(
        draw, streams, args.online_prefix, calibration, step, defaults.run_length, window
    )
    _, at_ert = delays(draw, streams, args.online_prefix, calibration, step, args.ert, window)
    ert_clean = clean_run(
        draw.raw,
        draw.pool("clean"),
        {"ert": tracker(draw.profile, calibration, step, args.ert, window)},
        {"ert": args.online_clean},
        # The same draws as the alibi-detect detectors' clean stream (see _jobs).
        seed=draw.seed + 7,
        chunk=args.online_clean,
    )["ert"]
    return {
        "runs": runs,
        "days_s": days_s,
        "per_day": per_day,
        "window": window_delays,
        "shipped": shipped,
        "at_ert": at_ert,
        "ert_clean": ert_clean,
    }


def _wide(draw: Draw, windows: Mapping[int, Windows], args: argparse.Namespace) -> dict[str, Any]:
    """Input and hidden-layer detectors at a small feature budget, first features against
    principal components, through the tracker (one draw)."""
    from dev.evaluation.draws import batches, captured, saved
    from hookwatch._profile import build_profile
    from hookwatch.tools.demo.build import reference_split
    from hookwatch.tools.demo.data import load_split

    _, x_ref, _ = reference_split(load_split(seed=draw.seed), seed=draw.seed)
    out: dict[str, Any] = {"profiles": {}, "fired": {}, "clean": {}}
    for projection in ("none", "pca"):
        config = with_budget(draw.config, WIDE_BUDGET, projection)
        profile = saved(build_profile(draw.model, config, batches(x_ref), "digits"))
        raw = captured(draw.model, config, np.concatenate([s.images for s in draw.scenarios]))
        chosen = tuple(n for n, r in profile.references.items() if r.level in WIDE_LEVELS)
        out["profiles"][projection] = profile
        for w, win in windows.items():
            calibration = profile.calibrate(
                w, config.drift.false_alarm_rate, args.calibration_windows, 0
            )
            rows = []
            for streams in win.streams.values():
                for stream in streams:
                    v = stream_verdicts(
                        profile, tuple(profile.references), calibration, raw, stream, win.step
                    )
                    rows.append(any_verdict({d: v[d] for d in chosen})[1 : 1 + JUDGEMENTS])
            out["fired"][projection, w] = np.concatenate(rows)
            extra = clean_windows(
                draw, w, args.hookwatch_clean_windows, np.random.default_rng(draw.seed + 99 * w)
            )
            v = stream_verdicts(
                profile, tuple(profile.references), calibration, raw, extra.ravel(), w
            )
            out["clean"][projection, w] = float(any_verdict({d: v[d] for d in chosen}).mean())
    return out


# ---------------------------------------------------------------------------- assembly


def _method_verdicts(
    hookwatch: HookwatchCells,
    baseline: Mapping[str, Any],
    names: list[str],
    reps: list[str],
    w: int,
    rows: slice,
) -> dict[str, NDArray[np.bool_]]:
    """One draw's verdicts on ``rows`` of its judged windows at W, per method: hookwatch and
    its ablations, the two ensembles, and each single-representation test at p < 0.01."""
    out = {name: hookwatch[name, w]["verdicts"][rows] for name in names}
    for key, label in ENSEMBLES:
        out[label] = baseline[f"{key}_{w}"][rows] < 0.01
    for test in ("ks", "mmd"):
        p = baseline[f"{test}_{w}"][rows]
        for r, rep in enumerate(reps):
            out[f"{test.upper()} {rep}"] = p[:, r] < 0.01
    return out


def _cells(
    draws: list[Draw],
    windows: list[dict[int, Windows]],
    hookwatch: list[HookwatchCells],
    baseline: list[dict[str, Any]],
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    """One row per shifted scenario and W: rates with intervals, first alarms, paired tests."""
    rng = np.random.default_rng(12345)
    names = [v.name for v in variants(draws[0].profile, PENULTIMATE)]
    reps = list(draws[0].reps)
    cells = []
    for scenario in (s for s in draws[0].scenarios if s.drifted):
        drop = float(np.mean([d.accuracy["clean"] - d.accuracy[scenario.name] for d in draws]))
        for w in args.windows:
            step = max(1, w // 4)
            verdicts: dict[str, list[NDArray[np.bool_]]] = {}
            for i in range(len(draws)):
                rows = windows[i][w].layout()[scenario.name]
                found = _method_verdicts(hookwatch[i], baseline[i], names, reps, w, rows)
                for key, value in found.items():
                    verdicts.setdefault(key, []).append(value)
            joined = {k: np.concatenate(v) for k, v in verdicts.items()}
            rates = {k: _rates(v) for k, v in joined.items()}
            methods = {
                k: {
                    "rate": float(r.mean()),
                    "interval": interval(r, rng),
                    "first_alarm": float(np.median(_first(joined[k], step))),
                }
                for k, r in rates.items()
            }
            best = {
                test: max(
                    (k for k in rates if k.startswith(test + " ")), key=lambda k: rates[k].mean()
                )
                for test in ("KS", "MMD")
            }
            against = {label: label for _, label in ENSEMBLES} | {
                f"best {t}": best[t] for t in ("KS", "MMD")
            }
            comparisons = {}
            for label, key in against.items():
                c = compare(rates["hookwatch"], rates[key], rng)
                comparisons[label] = {
                    "against": key,
                    "difference": c.difference,
                    "p": c.p,
                    "verdict": c.verdict,
                }
            cells.append(
                {
                    "scenario": scenario.name,
                    "w": w,
                    "accuracy_drop": drop,
                    "harmful": drop >= HARMFUL_DROP,
                    "streams": len(rates["hookwatch"]),
                    "methods": methods,
                    "best": best,
                    "comparisons": comparisons,
                }
            )
    return cells


def _false_alarms(
    draws: list[Draw],
    windows: list[dict[int, Windows]],
    hookwatch: list[HookwatchCells],
    baseline: list[dict[str, Any]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Per W and method: share of the shared clean windows that alarmed, per draw."""
    names = [v.name for v in variants(draws[0].profile, PENULTIMATE)]
    reps = list(draws[0].reps)
    out: dict[str, Any] = {}
    for w in args.windows:
        per: dict[str, list[float]] = {}
        for i in range(len(draws)):
            rows = windows[i][w].layout()["clean"]
            found = _method_verdicts(hookwatch[i], baseline[i], names, reps, w, rows)
            for key, value in found.items():
                per.setdefault(key, []).append(float(value.mean()))
                if key == names[-1]:
                    # Right after hookwatch's own variants, as the table lists them.
                    per.setdefault("hookwatch, extra windows", []).append(
                        hookwatch[i]["hookwatch", w]["clean_extra"]
                    )
        out[str(w)] = per
    return out


def _streaming(
    draws: list[Draw], hookwatch: list[HookwatchCells], args: argparse.Namespace
) -> dict[str, Any]:
    """Per W: the worker's streaming state in bytes (sliding windows and anytime-valid tests,
    as a worker builds them) and how long calibration at load took (median over draws)."""
    defaults = DriftConfig()
    out: dict[str, Any] = {}
    for w in args.windows:
        profile = draws[0].profile
        calibration = profile.calibrate(w, defaults.false_alarm_rate, 500, 0)
        state = tracker(profile, calibration, max(1, w // 4), defaults.run_length, w)
        out[str(w)] = {
            "state_kib": state.state_bytes() / 1024,
            "calibration_s": float(
                np.median([h["hookwatch", w]["calibration_s"] for h in hookwatch])
            ),
        }
    return out


def _delay_summary(values: list[NDArray[np.float64]]) -> dict[str, float]:
    joined = np.concatenate(values)
    return {
        "median": float(np.median(joined)),
        "detected": float(np.isfinite(joined).mean()),
        "streams": len(joined),
    }


def _timeline_summary(
    draws: list[Draw],
    timelines: list[dict[str, Any]],
    baseline: list[dict[str, Any]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    defaults = DriftConfig()
    per_day = timelines[0]["per_day"]
    days = []
    for draw, t in zip(draws, timelines, strict=True):
        run = t["runs"]["defaults"]
        days.append(
            {
                "seed": draw.seed,
                "days": run.samples / per_day,
                "sequential_alarms": run.sequential_alarms,
                "first_sequential_alarm_days": None
                if run.first_sequential_alarm is None
                else run.first_sequential_alarm / per_day,
                "window_rounds": run.rounds,
                "window_alarmed_rounds": run.alarmed_rounds,
                "first_window_alarm_hours": None
                if run.first_window_alarm is None
                else run.first_window_alarm / per_day * 24,
            }
        )
    checks = {}
    for name in timelines[0]["runs"]:
        if name == "defaults":
            continue
        runs = [t["runs"][name] for t in timelines]
        samples = sum(r.samples for r in runs)
        run_length = int(name.split()[-1])
        checks[name] = {
            "run_length": run_length,
            "samples": samples,
            "alarms": sum(r.sequential_alarms for r in runs),
            "bound": samples / run_length,
        }
    scenarios = list(timelines[0]["window"].first)
    delays_table: dict[str, dict[str, Any]] = {}
    offset = 0
    for name in scenarios:
        streams = len(timelines[0]["window"].first[name])
        rows = slice(offset, offset + streams)
        offset += streams
        delays_table[name] = {
            "window": _delay_summary([t["window"].first[name] for t in timelines]),
            "shipped": _delay_summary([t["shipped"].first[name] for t in timelines]),
            "at_ert": _delay_summary([t["at_ert"].first[name] for t in timelines]),
        }
        for test in ("cvm", "mmd"):
            first = [b[f"{test}_first"][rows] for b in baseline]
            values = [
                np.where(f >= 0, f - args.online_prefix + 1, np.inf).astype(np.float64)
                for f in first
            ]
            delays_table[name][test] = _delay_summary(values)
    clean = {
        "samples": args.online_clean * len(draws),
        "hookwatch": sum(t["ert_clean"].sequential_alarms for t in timelines),
        "cvm": int(sum(int(b["cvm_clean_alarms"]) for b in baseline)),
        "mmd": int(sum(int(b["mmd_clean_alarms"]) for b in baseline)),
        "early": {
            "hookwatch": int(
                sum(int(sum(v.sum() for v in t["at_ert"].early.values())) for t in timelines)
            ),
            "cvm": int(sum(int(b["cvm_early"].sum()) for b in baseline)),
            "mmd": int(sum(int(b["mmd_early"].sum()) for b in baseline)),
        },
    }
    return {
        "defaults": {
            "window": defaults.window,
            "step": defaults.effective_step,
            "run_length": defaults.run_length,
            "false_alarm_rate": defaults.false_alarm_rate,
            "sampled_per_second": SAMPLED_PER_SECOND,
        },
        "days": days,
        "checks": checks,
        "delays": delays_table,
        "online_clean": clean,
        "seconds": [t["days_s"] for t in timelines],
    }


def _rewrite_readme(out: Path, results: Mapping[str, Any]) -> None:
    """The findings block (report.FINDINGS_FILE) follows the committed table (and only that one)."""
    if out.resolve() == (ROOT / "docs" / "eval-drift.md").resolve():
        report.rewrite_readme(ROOT / report.FINDINGS_FILE, results)
        print(f"rewrote the eval-drift block of {ROOT / report.FINDINGS_FILE}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.render is not None:
        rendered = json.loads(args.render.read_text())
        args.out.write_text(report.markdown(rendered) + "\n")
        _rewrite_readme(args.out, rendered)
        return 0
    started = time.perf_counter()
    config = read_model_config(ROOT / "models/digits/model-config.yaml").monitoring
    if args.only_wide is not None:
        return _only_wide(args, config)
    python = args.baseline_python
    if not Path(python).exists():
        raise SystemExit(
            f"expected the benchmark environment's Python at {python} (make eval-drift)"
        )
    draws: list[Draw] = []
    windows: list[dict[int, Windows]] = []
    with tempfile.TemporaryDirectory() as tmp:
        jobs: list[tuple[Path, float]] = []
        for seed in range(args.seeds):
            draw = make_draw(seed, config)
            draws.append(draw)
            windows.append(_draw_windows(draw, args))
            jobs += _jobs(draw, windows[-1], args, Path(tmp))
            print(
                f"draw {seed}: held-out accuracy {draw.accuracy['clean']:.1%} "
                f"({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
        procs = _start_baselines(jobs, python)
        hookwatch: list[HookwatchCells] = []
        timelines: list[dict[str, Any]] = []
        for draw in draws:
            hookwatch.append(_hookwatch_cells(draw, windows[draw.seed], args))
            print(
                f"hookwatch draw {draw.seed}: windows done ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
            timelines.append(_timeline(draw, args))
            print(
                f"hookwatch draw {draw.seed}: timeline done "
                f"({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
        wide = None if args.no_wide else _wide(draws[0], windows[0], args)
        for proc in procs:
            if proc.wait() != 0:
                raise SystemExit(f"the baselines exited with status {proc.returncode}")
        baseline: list[dict[str, Any]] = []
        impl = ""
        checked = 0
        for draw in draws:
            merged: dict[str, Any] = {}
            for kind in ("windows", "online"):
                with np.load(Path(tmp) / f"{kind}-{draw.seed}.out.npz") as data:
                    merged.update({k: data[k] for k in data.files})
            impl = merged.pop("impl").tobytes().decode()
            checked += int(merged.pop("checked"))
            baseline.append(merged)
    results: dict[str, Any] = {
        "meta": {
            "seconds": time.perf_counter() - started,
            "cores": os.cpu_count(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "baselines": impl,
            "alibi_checked_windows": checked,
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        },
        "setup": report.setup(draws, PENULTIMATE),
        "false_alarms": _false_alarms(draws, windows, hookwatch, baseline, args),
        "cells": _cells(draws, windows, hookwatch, baseline, args),
        "timeline": _timeline_summary(draws, timelines, baseline, args),
        "streaming": _streaming(draws, hookwatch, args),
        "wide": None
        if wide is None
        else report.wide_summary(wide, draws[0], windows[0], args.windows),
        "scenarios": [{"name": s.name, "description": s.description} for s in draws[0].scenarios],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=float) + "\n")
    args.out.write_text(report.markdown(results) + "\n")
    _rewrite_readme(args.out, results)
    print(f"wrote {args.out} in {results['meta']['seconds']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
