"""The markdown of ``docs/eval-drift.md``, written from the numbers in ``docs/eval-drift.json``.

Method descriptions are fixed text; every figure, count, verdict and list of cells is computed
from the results, so a rerun that comes out differently says so in its own words.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dev.evaluation.draws import Draw
from dev.evaluation.protocol import FULL, JUDGEMENTS, Windows, variants

__all__ = [
    "find_readme_block",
    "markdown",
    "readme_block",
    "rewrite_readme",
    "setup",
    "wide_summary",
]


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def _pct1(x: float) -> str:
    return f"{100 * x:.1f} %"


def _span(values: list[float]) -> str:
    mean = float(np.mean(values))
    if min(values) == max(values):
        return _pct1(mean)
    return f"{_pct1(mean)} ({_pct1(min(values))}-{_pct1(max(values))})"


def _delay(x: float, cap: str) -> str:
    return cap if math.isinf(x) else f"{x:.0f}"


def setup(draws: list[Draw], penultimate: str) -> dict[str, Any]:
    profile = draws[0].profile
    refs = profile.references
    return {
        "accuracy": [d.accuracy["clean"] for d in draws],
        "reference": [d.profile.references["input"].n_ref for d in draws],
        "features": sum(r.n_features for r in refs.values()),
        "detectors": {name: r.level for name, r in refs.items()},
        "profile_kib": profile.size_bytes() / 1024,
        "bins": profile.bins,
        "representations": {rep: int(v.shape[1]) for rep, v in draws[0].reps.items()},
        "variants": {v.name: v.description for v in variants(profile, penultimate)},
        "penultimate": penultimate,
        "test_images": draws[0].sizes["clean"],
    }


def wide_summary(
    wide: Mapping[str, Any], draw: Draw, windows: Mapping[int, Windows], sizes: list[int]
) -> dict[str, Any]:
    pca = wide["profiles"]["pca"]
    kept = []
    for layer, ref in wide["profiles"]["none"].references.items():
        if ref.level not in ("input", "activation"):
            continue
        projection = pca.projections.get(layer)
        width = ref.n_features + len(ref.dropped)
        if projection is None:
            kept.append(f"`{layer}` {width} features either way")
        else:
            rest = " and the residual distance" if projection.residual else ""
            kept.append(
                f"`{layer}` its first {width} of {projection.input_width} features, or "
                f"{projection.components.shape[1]} principal components keeping "
                f"{100 * projection.explained:.1f} % of the reference variance{rest}"
            )
    rates: dict[str, dict[str, float]] = {}
    for scenario in (s for s in draw.scenarios if s.drifted):
        for w in sizes:
            rows = windows[w].layout()[scenario.name]
            for projection in ("none", "pca"):
                fired = wide["fired"][projection, w][rows]
                share = float(fired.reshape(-1, JUDGEMENTS)[:, FULL].mean())
                rates.setdefault(scenario.name, {})[f"{projection} {w}"] = share
    clean = {f"{p} {w}": v for (p, w), v in wide["clean"].items()}
    return {"kept": kept, "rates": rates, "clean": clean, "sizes": sizes}


def _verdicts(cells: list[dict[str, Any]], against: str) -> str:
    counts = Counter(c["comparisons"][against]["verdict"] for c in cells)
    return f"{counts['win']} wins, {counts['tie']} ties, {counts['loss']} losses"


#: The file holding the generated findings block (repository-relative): docs/your-model.md's
#: Drift section; README.md links to it.
FINDINGS_FILE = "docs/your-model.md"
#: The findings block: the committed evaluation's findings, every sentence rendered
#: from docs/eval-drift.json by :func:`readme_block` (a test compares the whole block).
README_BEGIN = (
    "<!-- eval-drift: rendered from docs/eval-drift.json by dev/evaluation/report.py "
    "(make eval-drift, or python -m dev.evaluation.run --render docs/eval-drift.json); "
    "do not edit -->"
)
README_END = "<!-- /eval-drift -->"
#: The share of clean windows the text section calibrates hookwatch's worker for
#: (``dev.evaluation.text`` calibrates with it; the JSON does not record it).
TEXT_FALSE_ALARM_RATE = 0.01


def _and(items: list[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _complete(cells: list[dict[str, Any]], methods: list[str]) -> str:
    """Which of ``methods`` detected every fully shifted window in every cell, and where the
    others fell short (their lowest cell)."""
    full = [m for m in methods if all(c["methods"][m]["rate"] >= 1.0 for c in cells)]
    parts = [f"in all {len(cells)} cells by {_and(full)}"] if full else []
    for m in methods:
        if m in full:
            continue
        done = sum(c["methods"][m]["rate"] >= 1.0 for c in cells)
        worst = min(cells, key=lambda c: c["methods"][m]["rate"])
        parts.append(
            f"in {done} of {len(cells)} by {m} (lowest: {_pct(worst['methods'][m]['rate'])}, "
            f"{worst['scenario']} at W={worst['w']})"
        )
    return "; ".join(parts)


def _losses(cells: list[dict[str, Any]], against: str) -> str:
    lost = [c for c in cells if c["comparisons"][against]["verdict"] == "loss"]
    if not lost:
        return ""
    return (
        " (lost: "
        + "; ".join(
            f"{c['scenario']} at W={c['w']}, to {c['comparisons'][against]['against']}"
            for c in lost
        )
        + ")"
    )


def _readme_timeline(results: Mapping[str, Any]) -> str:
    from scipy.stats import chi2

    t = results["timeline"]
    d = t["defaults"]
    days = sum(row["days"] for row in t["days"])
    alarms = sum(row["sequential_alarms"] for row in t["days"])
    rounds = sum(row["window_rounds"] for row in t["days"])
    alarmed = sum(row["window_alarmed_rounds"] for row in t["days"])
    per_day = [row["window_alarmed_rounds"] / row["days"] for row in t["days"]]
    # Poisson 95 % upper confidence bound on the daily rate of the observed count.
    upper = float(chi2.ppf(0.95, 2 * (alarms + 1)) / 2) / days
    days_per_run = d["run_length"] / d["sampled_per_second"] / 86_400
    return (
        "- Over time at the defaults, on clean traffic drawn from the reference's distribution "
        f"({len(t['days'])} draws): {alarms} anytime-valid false alarms in {days:.0f} simulated "
        f"days; a run this long bounds their rate only by {upper:.2f} a day (95 %), and the "
        f"test is built for at most 1 per {days_per_run:.0f} days. The sliding windows "
        f"alarmed on {_pct1(alarmed / max(rounds, 1))} of their verdicts ({min(per_day):.0f}-"
        f"{max(per_day):.0f} alarming verdicts a day per draw); they warn, the anytime-valid "
        "test pages."
    )


def _readme_delay(results: Mapping[str, Any]) -> str:
    t = results["timeline"]
    length = results["meta"]["args"]["online_length"]
    shipped = {name: row["shipped"] for name, row in t["delays"].items()}
    medians = {name: row["median"] for name, row in shipped.items()}
    slowest = max(medians, key=lambda k: medians[k])
    rest = [v for k, v in medians.items() if k != slowest]
    missed = [f"{name} {_pct(row['detected'])}" for name, row in shipped.items()
              if row["detected"] < 1.0]  # fmt: skip
    detected = (
        f"every stream of every scenario detected within {length} shifted requests"
        if not missed
        else f"streams detected within {length} shifted requests: "
        + ", ".join(missed)
        + "; every stream of the others"
    )
    return (
        "- Detection delay of the anytime-valid test at the shipped run length, median shifted "
        f"requests until the first alarm: {_delay(min(rest), '-')}-{_delay(max(rest), '-')} in "
        f"{len(rest)} of {len(medians)} scenarios, {slowest} "
        f"{_delay(medians[slowest], f'> {length}')}; "
        f"{detected}."
    )


def _readme_detection(results: Mapping[str, Any]) -> str:
    cells = results["cells"]
    harmful = [c for c in cells if c["harmful"]]
    against = list(cells[0]["comparisons"])
    drops = [100 * c["accuracy_drop"] for c in harmful]
    scenarios = list(dict.fromkeys(c["scenario"] for c in harmful))
    ws = sorted({c["w"] for c in harmful})
    methods = ["hookwatch", *(a for a in against if not a.startswith("best"))]
    lines = [
        f"- Harmful shifts ({len(scenarios)} scenarios that lower accuracy by "
        f"{min(drops):.1f}-{max(drops):.1f} points, at W={', '.join(map(str, ws))}: "
        f"{len(harmful)} cells): every fully shifted window detected "
        + _complete(harmful, methods)
        + ". Verdicts on them against "
        + "; against ".join(f"{a}: {_verdicts(harmful, a)}" for a in against)
        + ".",
        f"  Over all {len(cells)} cells, harmless shifts included, against "
        + "; against ".join(f"{a}: {_verdicts(cells, a)}{_losses(cells, a)}" for a in against)
        + ". KS-OR and MMD-OR are the jointly calibrated ensembles; best KS and best MMD the "
        "single representation with the highest rate in each cell, chosen after the fact.",
    ]
    return "\n".join(lines)


def _readme_clean(results: Mapping[str, Any]) -> str:
    far = results["false_alarms"]
    target = results["timeline"]["defaults"]["false_alarm_rate"]
    args = results["meta"]["args"]

    def means(key: str) -> str:
        return ", ".join(f"{_pct1(float(np.mean(v[key])))} at W={w}" for w, v in far.items())

    highest = ", ".join(f"{_pct1(max(v['hookwatch']))} at W={w}" for w, v in far.items())
    above = [f"W={w}" for w, v in far.items() if float(np.mean(v["hookwatch"])) > target]
    verdict = f"above the target at {_and(above)}" if above else "at or below the target at every W"
    return (
        f"- Clean held-out windows alarming (target {_pct(target)} per verdict), hookwatch's "
        f"mean over draws on the {args['clean_windows']} windows per draw every method saw: "
        f"{means('hookwatch')}; on {args['hookwatch_clean_windows']:,} more per draw: "
        f"{means('hookwatch, extra windows')}. The highest single draw: {highest}. "
        f"The mean on the shared windows is {verdict}."
    )


def _readme_text(results: Mapping[str, Any]) -> list[str]:
    text = results.get("text")
    if text is None:
        return []
    by = {(c["w"], c["method"]): c for c in text["cells"]}
    ws = sorted({c["w"] for c in text["cells"]})
    w = ws[len(ws) // 2]
    short = {"hookwatch": "hookwatch", "KS (embedding)": "KS", "MMD (embedding)": "MMD"}

    def rate(method: str, scenario: str) -> float:
        # Compared as shown, at 0.1 %.
        return round(float(np.mean(by[(w, method)]["equal_rate"][scenario])), 3)

    names = [s["name"] for s in text["scenarios"]]
    detected = "; ".join(
        f"{n}: " + ", ".join(f"{label} {_pct1(rate(m, n))}" for m, label in short.items())
        for n in names
    )

    def standing(baseline: str) -> str:
        mine = [rate("hookwatch", n) for n in names]
        theirs = [rate(baseline, n) for n in names]
        pairs = list(zip(mine, theirs, strict=True))
        return (
            f"ahead of {short[baseline]} on {sum(a > b for a, b in pairs)}, level on "
            f"{sum(a == b for a, b in pairs)}, behind on {sum(a < b for a, b in pairs)}"
        )

    clean = {v: float(np.mean(by[(v, "hookwatch")]["false_alarms"])) for v in ws}
    held = [f"W={v}" for v in ws if clean[v] <= TEXT_FALSE_ALARM_RATE]
    over = [f"W={v}" for v in ws if clean[v] > TEXT_FALSE_ALARM_RATE]
    return [
        f"- Text, {text['model']}, with the `computers` fortunes as reference "
        f"({min(text['reference'])} texts a draw): at an equal "
        f"{_pct(text['equal_rate'])} false-alarm rate on windows of {w} texts, the share of "
        f"shifted windows detected, {detected} (KS and MMD: alibi-detect on the sentence "
        "embeddings; hookwatch on its token-averaged layers and the embedding). Of the "
        f"{len(names)} scenarios, hookwatch is {standing('KS (embedding)')}, and "
        f"{standing('MMD (embedding)')}. At its own calibrated "
        f"{_pct(TEXT_FALSE_ALARM_RATE)}, hookwatch's clean text windows alarm on "
        + ", ".join(f"{_pct1(clean[v])} at W={v}" for v in ws)
        + " (mean over draws): "
        + "; ".join(
            part
            for part in (
                f"at or below the target at {_and(held)}" if held else "",
                f"above it at {_and(over)}" if over else "",
            )
            if part
        )
        + "."
    ]


def readme_block(results: Mapping[str, Any]) -> str:
    """The eval-drift findings block (in FINDINGS_FILE), markers included: every sentence
    rendered from ``results`` (docs/eval-drift.json), none written by hand."""
    meta = results["meta"]
    text = results.get("text")
    took = f"the image sections took {meta['seconds']:.0f} s"
    if text is not None:
        took += f", the text section {text['seconds']:.0f} s (`make eval-drift-text` runs it alone)"
    return "\n".join(
        [
            README_BEGIN,
            f"Committed run ({meta['cores']} cores, {meta['machine']}, Python "
            f"{meta['python']}): {took}.",
            "",
            _readme_timeline(results),
            _readme_delay(results),
            _readme_detection(results),
            _readme_clean(results),
            *_readme_text(results),
            README_END,
        ]
    )


def find_readme_block(readme: str) -> str:
    """The eval-drift block of ``readme`` (FINDINGS_FILE's text) as it stands, markers included."""
    start = readme.find(README_BEGIN)
    stop = readme.find(README_END)
    if start < 0 or stop < start:
        raise ValueError(
            f"expected {FINDINGS_FILE} to hold {README_BEGIN!r} then {README_END!r}, got "
            f"{'neither' if start < 0 and stop < 0 else 'one of them, or out of order'}"
        )
    return readme[start : stop + len(README_END)]


def rewrite_readme(readme: Path, results: Mapping[str, Any]) -> None:
    """Replace the eval-drift block of ``readme`` (FINDINGS_FILE) with :func:`readme_block`."""
    text = readme.read_text()
    readme.write_text(text.replace(find_readme_block(text), readme_block(results)))


def _summary(results: Mapping[str, Any]) -> list[str]:
    cells = results["cells"]
    harmful = [c for c in cells if c["harmful"]]
    harmless = [c for c in cells if not c["harmful"]]
    lines = ["## Summary", ""]
    for against in cells[0]["comparisons"]:
        what = (
            f"the best single {against.split()[1]} representation, chosen per cell after the fact"
            if against.startswith("best")
            else f"{against}, the jointly calibrated ensemble"
        )
        lines.append(
            f"- hookwatch against {what}: on harmful shifts {_verdicts(harmful, against)} "
            f"({len(harmful)} cells); on harmless ones {_verdicts(harmless, against)} "
            f"({len(harmless)} cells). A win or loss is a paired sign-flip test over streams at "
            "p < 0.05; anything else is a tie."
        )
    far = results["false_alarms"]
    lines.append(
        "- Clean windows alarming, target 1 %, mean over draws: hookwatch "
        + ", ".join(f"W={w} {_pct1(float(np.mean(v['hookwatch'])))}" for w, v in far.items())
        + "; on the extra clean windows "
        + ", ".join(
            f"W={w} {_pct1(float(np.mean(v['hookwatch, extra windows'])))}" for w, v in far.items()
        )
        + "."
    )
    t = results["timeline"]
    days = sum(d["days"] for d in t["days"])
    alarms = sum(d["sequential_alarms"] for d in t["days"])
    rounds = sum(d["window_rounds"] for d in t["days"])
    alarmed = sum(d["window_alarmed_rounds"] for d in t["days"])
    from scipy.stats import chi2

    # Poisson upper confidence bound on the rate of the observed count.
    upper = float(chi2.ppf(0.95, 2 * (alarms + 1)) / 2) / days
    lines.append(
        f"- Over time, at the defaults: {alarms} anytime-valid false alarms in {days:.0f} "
        f"simulated days of clean traffic ({alarms / days:.3f} per day, 95 % upper bound "
        f"{upper:.3f}; target at most "
        f"1 per 30 days, {1 / 30:.3f} per day). The sliding window alarmed on "
        f"{alarmed} of {rounds} verdicts ({_pct1(alarmed / max(rounds, 1))}), "
        f"{alarmed / days:.0f} alarming verdicts a day."
    )
    return [*lines, ""]


def _setup(results: Mapping[str, Any]) -> list[str]:
    s = results["setup"]
    meta = results["meta"]
    args = meta["args"]
    acc = s["accuracy"]
    reps = ", ".join(f"{rep} ({f} features)" for rep, f in s["representations"].items())
    return [
        "## Setup",
        "",
        f"- **Draws**: {len(acc)} seeds. Each splits scikit-learn's digits anew, trains the "
        "demo CNN as `make mar` does on 70 % of the training split and builds the profile from "
        f"the other 30 % ({min(s['reference'])}-{max(s['reference'])} reference images); "
        f"held-out accuracy {_pct1(min(acc))}-{_pct1(max(acc))}. The profile "
        f"({s['bins']} bins per feature, {s['features']} features over "
        f"{len(s['detectors'])} detectors, {s['profile_kib']:.0f} KiB) is written to its file "
        "and read back before anything is measured.",
        "- **hookwatch** runs as the worker runs it: the captured features of every watched "
        "layer go through `DriftTracker` (bin codes, sliding windows, a verdict every W/4 "
        "samples) with thresholds calibrated from the saved profile for 1 % of clean windows "
        "alarming on any detector. Ablations, each calibrated alone at 1 %: "
        + "; ".join(f"**{k}**: {v}" for k, v in s["variants"].items() if k != "hookwatch")
        + ".",
        f"- **Baselines** ({meta['baselines']}), given the same information: the features "
        f"hookwatch's detectors read for each representation: {reps}. **KS <rep>**: "
        "`KSDrift` (Bonferroni over features), **MMD <rep>**: `MMDDrift` (PyTorch backend, "
        f"{args['permutations']} permutations), each at p < 0.01. **KS-OR** and **MMD-OR**: an "
        "alarm when any representation's test is extreme, jointly calibrated at 1 % by a "
        "Westfall-Young permutation test over the same permutations for every representation "
        "(KS-OR on the smallest Bonferroni p-value, MMD-OR on the largest standardised MMD^2). "
        "The harness computes the statistics vectorised and checked them against alibi-detect's "
        f"own `KSDrift` and `MMDDrift` on {meta['alibi_checked_windows']} windows.",
        f"- **Protocol**, per draw, W and scenario: {args['streams']} streams of W clean "
        "requests then 2W shifted ones, judged every W/4 requests on the last W; a stream's "
        "detection rate is the share of its 5 judgements on fully shifted windows that alarm. "
        f"{args['clean_windows']} clean windows per draw and W (W distinct held-out images "
        f"each) for every method, {args['hookwatch_clean_windows']} more for hookwatch. "
        f"Intervals: 95 % bootstrap over the {len(acc) * args['streams']} streams of a cell. "
        "Verdicts: paired sign-flip test over streams.",
        "- **Harmful** shifts lower the model's accuracy by at least 2 points (mean over "
        "draws); the others are reported apart: detecting them is not wrong, but it is not "
        "what pages are for.",
        "",
    ]


def _false_alarm_table(results: Mapping[str, Any]) -> list[str]:
    far = results["false_alarms"]
    methods = list(next(iter(far.values())))
    lines = [
        "## False alarms on clean held-out windows",
        "",
        "Share of clean windows that alarm, target 1 %: mean over draws (lowest-highest draw).",
        "",
        "| method | " + " | ".join(f"W={w}" for w in far) + " |",
        "|---|" + "---|" * len(far),
    ]
    for m in methods:
        lines.append(f"| {m} | " + " | ".join(_span(far[w][m]) for w in far) + " |")
    return [*lines, ""]


def _cell_rate(cell: Mapping[str, Any], method: str, with_interval: bool) -> str:
    m = cell["methods"][method]
    if not with_interval:
        return _pct(m["rate"])
    lo, hi = m["interval"]
    return f"{_pct(m['rate'])} [{_pct(lo)}-{_pct(hi)}]"


def _comparison(cell: Mapping[str, Any], against: str) -> str:
    c = cell["comparisons"][against]
    if c["verdict"] == "tie":
        return f"tie ({100 * c['difference']:+.0f})"
    return f"**{c['verdict']}** ({100 * c['difference']:+.0f}, p={c['p']:.3f})"


def _detection(results: Mapping[str, Any]) -> list[str]:
    cells = results["cells"]
    variants_ = list(results["setup"]["variants"])
    lines = [
        "## Detection",
        "",
        "Share of fully shifted windows detected (mean over streams, [95 % interval]); the "
        "verdict columns compare hookwatch with the method named, points of detection rate.",
        "",
    ]
    for harmful in (True, False):
        group = [c for c in cells if c["harmful"] == harmful]
        if not group:
            continue
        lines += [
            f"### {'Harmful' if harmful else 'Harmless'} shifts",
            "",
            "| scenario | accuracy drop | W | "
            + " | ".join(variants_)
            + " | KS-OR | MMD-OR | best KS | best MMD"
            + " | vs KS-OR | vs MMD-OR | vs best KS | vs best MMD |",
            "|---|---|---|" + "---|" * (len(variants_) + 8),
        ]
        for c in group:
            rates = [_cell_rate(c, v, v == "hookwatch") for v in variants_]
            rates += [_cell_rate(c, "KS-OR", True), _cell_rate(c, "MMD-OR", True)]
            for t in ("KS", "MMD"):
                key = c["best"][t]
                rates.append(f"{_pct(c['methods'][key]['rate'])} ({key.split(' ', 1)[1]})")
            verdicts = [_comparison(c, a) for a in c["comparisons"]]
            lines.append(
                f"| {c['scenario']} | {100 * c['accuracy_drop']:.1f} pts | {c['w']} | "
                + " | ".join(rates + verdicts)
                + " |"
            )
        lines.append("")
    lines += [
        "### First alarm",
        "",
        "Median shifted requests until a stream's first alarm (judgements every W/4; "
        "`> 2W`: most streams had none).",
        "",
        "| scenario | W | hookwatch | KS-OR | MMD-OR |",
        "|---|---|---|---|---|",
    ]
    for c in cells:
        cap = f"> {2 * c['w']}"
        lines.append(
            f"| {c['scenario']} | {c['w']} | "
            + " | ".join(
                _delay(c["methods"][m]["first_alarm"], cap)
                for m in ("hookwatch", "KS-OR", "MMD-OR")
            )
            + " |"
        )
    return [*lines, ""]


def _timeline(results: Mapping[str, Any]) -> list[str]:
    t = results["timeline"]
    d = t["defaults"]
    args = results["meta"]["args"]
    days_per_run = d["run_length"] / d["sampled_per_second"] / 86_400
    lines = [
        "## Over time: anytime-valid alarms",
        "",
        "For each draw, a reference as large as the draw's, drawn with replacement from all "
        f"its held-out images ({results['setup']['reference'][0] + results['setup']['test_images']}"
        "; none seen in training), is built into a profile, saved and loaded; the worker's "
        f"tracker at the library defaults (window {d['window']}, step {d['step']}, "
        f"sliding-window false alarm rate {_pct(d['false_alarm_rate'])} per verdict, "
        f"anytime-valid run length {d['run_length']:,} sampled requests: {days_per_run:.0f} days "
        f"at {d['sampled_per_second']} sampled requests a second, 100 requests/s at 10 % "
        "sampling) is then fed independent draws from the same images in time order: traffic "
        "and reference from one distribution, which is what the guarantees are stated for.",
        "",
        "| draw | simulated days | anytime-valid false alarms | first one after | "
        "sliding-window alarming verdicts | per day | first one after |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in t["days"]:
        first_seq = (
            "-"
            if row["first_sequential_alarm_days"] is None
            else f"{row['first_sequential_alarm_days']:.2f} days"
        )
        hours = row["first_window_alarm_hours"]
        first_win = (
            "-" if hours is None else f"{hours:.1f} h" if hours >= 1 else f"{60 * hours:.0f} min"
        )
        lines.append(
            f"| {row['seed']} | {row['days']:.1f} | {row['sequential_alarms']} | {first_seq} | "
            f"{row['window_alarmed_rounds']} of {row['window_rounds']} | "
            f"{row['window_alarmed_rounds'] / row['days']:.0f} | {first_win} |"
        )
    lines += [
        "",
        "The guarantee is a rate: at most one false alarm per run length of sampled requests "
        "in expectation. Checked where false alarms are frequent enough to count, on the same "
        "kind of traffic:",
        "",
        "| run length | samples | false alarms | at most (samples / run length) |",
        "|---|---|---|---|",
    ]
    for check in t["checks"].values():
        lines.append(
            f"| {check['run_length']:,} | {check['samples']:,} | {check['alarms']} | "
            f"{check['bound']:.0f} |"
        )
    clean = t["online_clean"]
    ert = args["ert"]
    lines += [
        "",
        "### Detection delay",
        "",
        f"Streams of {args['online_prefix']} clean then {args['online_length']} shifted "
        f"requests ({args['online_streams']} per scenario and draw): median shifted requests "
        "until the first alarm and the share of streams detected at all. Sliding window at "
        f"the defaults; anytime-valid at the shipped run length and at {ert:,}; alibi-detect's "
        f"`CVMDriftOnline` (softmax) and `MMDDriftOnline` ({results['setup']['penultimate']}) "
        f"configured for an expected run time of {ert:,} with window {args['online_window']} "
        "(their calibration simulates streams, which a run length of days would need far too "
        "many of).",
        "",
        "| scenario | sliding window | anytime-valid, shipped | anytime-valid, "
        f"{ert:,} | CVMDriftOnline, {ert:,} | MMDDriftOnline, {ert:,} |",
        "|---|---|---|---|---|---|",
    ]
    cap = f"> {args['online_length']}"
    for name, row in t["delays"].items():
        cells = [
            f"{_delay(row[k]['median'], cap)} ({_pct(row[k]['detected'])})"
            for k in ("window", "shipped", "at_ert", "cvm", "mmd")
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    samples = clean["samples"]
    lines += [
        "",
        f"Run length measured on {samples:,} clean samples (each detector restarted after "
        f"every alarm; {ert:,} promised): hookwatch {clean['hookwatch']} alarms, "
        f"CVMDriftOnline {clean['cvm']}, MMDDriftOnline {clean['mmd']}. Alarms on the clean "
        f"prefixes of the delay streams: hookwatch {clean['early']['hookwatch']}, "
        f"CVMDriftOnline {clean['early']['cvm']}, MMDDriftOnline {clean['early']['mmd']}.",
        "",
    ]
    return lines


def _components(text: Mapping[str, Any]) -> str:
    """The text section's component count: what the profiles held, or, for a run that did
    not record it, the budget's most."""
    counts = text.get("components")
    if not counts:
        return str(text["max_features"] - 1)
    return " or ".join(map(str, counts))


def _wide(results: Mapping[str, Any]) -> list[str]:
    wide = results["wide"]
    if wide is None:
        return []
    sizes = wide["sizes"]
    lines = [
        "## Wide layers: principal components against the first features",
        "",
        "Draw 0 with `max_features: 16`, below the widths of the input (64 pixels), act2 and "
        "act3, once with `drift.projection: none` and once with `pca` (the default), each "
        "calibrated on all its detectors and run through the tracker; a window counts as "
        "detected when an input or hidden-layer detector fires. Kept: "
        + "; ".join(wide["kept"])
        + "."
        + (
            f" This section was rerun alone (`--only-wide`) on {wide['rerun']['when']}, in "
            f"{wide['rerun']['seconds']:.0f} s, after the rest."
            if "rerun" in wide
            else ""
        ),
        "",
        "| scenario | " + " | ".join(f"W={w} first features | W={w} PCA" for w in sizes) + " |",
        "|---|" + "---|---|" * len(sizes),
        "| clean (false alarms) | "
        + " | ".join(
            f"{_pct1(wide['clean'][f'none {w}'])} | {_pct1(wide['clean'][f'pca {w}'])}"
            for w in sizes
        )
        + " |",
    ]
    for name, rates in wide["rates"].items():
        lines.append(
            f"| {name} | "
            + " | ".join(f"{_pct(rates[f'none {w}'])} | {_pct(rates[f'pca {w}'])}" for w in sizes)
            + " |"
        )
    return [*lines, ""]


def _streaming(results: Mapping[str, Any]) -> list[str]:
    rows = results["streaming"]
    args = results["meta"]["args"]
    return [
        "## Bounded streaming",
        "",
        "A worker's drift state for the profile (sliding windows of bin codes and the "
        "anytime-valid tests), whatever the traffic, and the time calibration takes at load "
        f"({args['calibration_windows']} resampled windows, median over draws, one core):",
        "",
        "| W | state | calibration at load |",
        "|---|---|---|",
        *[
            f"| {w} | {r['state_kib']:.0f} KiB | {r['calibration_s']:.1f} s |"
            for w, r in rows.items()
        ],
        "",
    ]


def _text(results: Mapping[str, Any]) -> list[str]:
    """The text section (``dev.evaluation.text``), when it has run."""
    text = results.get("text")
    if text is None:
        return []
    args = text["args"]
    names = [s["name"] for s in text["scenarios"]]
    head = "| W | method | clean windows alarming | " + " | ".join(names) + " |"
    rule = "|---|---|---|" + "---|" * len(names)

    def rows(key: str) -> list[str]:
        return [
            f"| {c['w']} | {c['method']} | "
            + (_span(c["false_alarms"]) if key == "detected" else _pct(text["equal_rate"]))
            + " | "
            + " | ".join(_span(c[key][n]) for n in names)
            + " |"
            for c in text["cells"]
        ]

    layers = ", ".join(f"`{layer}`" for layer in text["layers"])
    return [
        "## Text: a sentence encoder on fortunes",
        "",
        f"{text['model']}, served as the text demo is (`models/minilm/`): watched {layers}, "
        f"each layer's 384 token-averaged units tested on {_components(text)} principal "
        "components (fitted on half the reference, binned on the other half) and the residual "
        "distance, the input on its token count. Per draw "
        f"({args['seeds']}), the `computers` fortunes ({text['texts']['computers']} texts) split "
        f"anew into a reference of {text['reference'][0]} (the profile, built through the serving "
        "hooks and read back from its file) and held-out clean traffic; windows of W distinct "
        f"texts: {args['clean_windows']} clean and {args['shifted_windows']} per shifted scenario "
        "per draw and W, each judged by a fresh worker tracker (thresholds calibrated at load, "
        f"{args['calibration_windows']} resampled windows) and, on the same windows' 384-d "
        "sentence embeddings, by alibi-detect's `KSDrift` (Bonferroni) and `MMDDrift` "
        f"({args['permutations']} permutations). `hookwatch (embedding only)`: its output "
        "detector alone, on the same embeddings as the baselines. Mean over draws (min-max).",
        "",
        "At each method's own setting (hookwatch: 1 % of clean windows alarming on any "
        "detector, calibrated on the reference; alibi-detect: p < 0.01):",
        "",
        head,
        rule,
        *rows("detected"),
        "",
        f"At an equal false-alarm rate: each method's threshold set on its own clean windows so "
        f"that {_pct(text['equal_rate'])} of them alarm (per draw and W), and the share of "
        "shifted windows past it:",
        "",
        head,
        rule,
        *rows("equal_rate"),
        "",
        "Scenarios: "
        + "; ".join(f"`{s['name']}`: {s['description']}" for s in text["scenarios"])
        + f". Computed in {text['seconds']:.0f} s by `python -m "
        "dev.evaluation.text` (the last step of `make eval-drift`).",
        "",
    ]


def markdown(results: Mapping[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        "# Drift detection: hookwatch through its own path, against alibi-detect",
        "",
        f"Written by `make eval-drift` in {meta['seconds']:.0f} s ({meta['cores']} cores, "
        f"{meta['machine']}, Python {meta['python']}) from the numbers in "
        "[eval-drift.json](eval-drift.json). Do not edit by hand.",
        "",
        *_summary(results),
        *_setup(results),
        *_false_alarm_table(results),
        *_detection(results),
        *_timeline(results),
        *_wide(results),
        *_streaming(results),
        *_text(results),
        "## Scenarios",
        "",
        *[f"- `{s['name']}`: {s['description']}" for s in results["scenarios"]],
    ]
    return "\n".join(lines)
