"""Judge a soak's JSON and render ``docs/soak/README.md`` and its plots from it.

Every figure in the README comes from the JSON: :func:`render` is a function of it alone, and
a test checks the committed README against it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: Unexpected answers the killed worker may cause: the request it was serving, and one the
#: frontend had already handed to its socket (answered 507, never seen by a handler).
KILL_ERRORS = 2
#: ... all within this many seconds of the kill.
KILL_ERROR_WINDOW_S = 15.0
#: Fewest samples a flatness fit is made from.
MIN_POINTS = 5

PLOTS = ("soak-processes.png", "soak-stack.png")


@dataclass(frozen=True)
class Fit:
    """A straight line through a process's samples over its fitted window."""

    name: str
    start_t: float
    end_t: float
    points: int
    first: float
    last: float
    low: float
    high: float
    #: Units per 10 minutes.
    slope: float


def _fit(name: str, points: Sequence[tuple[float, float]]) -> Fit | None:
    if len(points) < MIN_POINTS:
        return None
    t = np.array([p[0] for p in points])
    y = np.array([p[1] for p in points])
    # Rounded: a flat line's -1e-15 reads as 0, not -0.00.
    slope = round(float(np.polyfit(t, y, 1)[0]) * 600.0, 6) + 0.0
    return Fit(
        name,
        float(t[0]),
        float(t[-1]),
        len(points),
        float(y[0]),
        float(y[-1]),
        float(y.min()),
        float(y.max()),
        slope,
    )


def _settings(result: Mapping[str, Any]) -> dict[str, Any]:
    settings: dict[str, Any] = result["settings"]
    return settings


def _first_seen(result: Mapping[str, Any]) -> dict[str, float]:
    """Each worker pid and the time of the first sample it is in."""
    seen: dict[str, float] = {}
    for sample in result["samples"]:
        for pid in sample["workers"]:
            seen.setdefault(pid, sample["t"])
    return seen


def _late_workers(result: Mapping[str, Any]) -> set[str]:
    """The worker pids first seen after the soak's first sample (a killed worker's
    replacement): their window starts ``settle_s`` after they appear."""
    samples = result["samples"]
    if not samples:
        return set()
    late_after = samples[0]["t"] + _settings(result)["sample_s"]
    return {pid for pid, t in _first_seen(result).items() if t > late_after}


def process_fits(result: Mapping[str, Any]) -> dict[str, tuple[Fit | None, Fit | None]]:
    """Per process (each worker pid, the exporter): the (RSS MiB, open fds) fits over its
    window: from ``warmup_s`` on, and for a worker that came later from ``settle_s`` after
    it was first seen, to its last sample."""
    s = _settings(result)
    seen = _first_seen(result)
    late = _late_workers(result)
    series: dict[str, list[tuple[float, float, float]]] = {}
    for sample in result["samples"]:
        for pid, (rss, fds) in sample["workers"].items():
            series.setdefault(f"worker {pid}", []).append((sample["t"], rss, fds))
        if sample["exporter"] is not None:
            rss, fds = sample["exporter"]
            series.setdefault("exporter", []).append((sample["t"], rss, fds))
    out: dict[str, tuple[Fit | None, Fit | None]] = {}
    for name, points in series.items():
        pid = name.removeprefix("worker ")
        start = s["warmup_s"]
        if name != "exporter" and pid in late:
            start = max(start, seen[pid] + s["settle_s"])
        kept = [p for p in points if p[0] >= start]
        if start > s["warmup_s"] and kept and kept[-1][0] - kept[0][0] < s["settle_s"]:
            # A worker that came late (the killed one's replacement) and lived less than
            # settle_s past its own warm-up: a slope over a few seconds extrapolated to 10
            # minutes measures its warm-up, not a leak. The 10-minute soak judges it.
            out[name] = (None, None)
            continue
        out[name] = (
            _fit(name, [(t, rss) for t, rss, _ in kept]),
            _fit(name, [(t, fds) for t, _, fds in kept]),
        )
    return out


def phases(result: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The samples of the steady stretches: after warm-up and before the kill, and from
    ``settle_s`` after the replacement was ready (the kill's transient left out)."""
    s = _settings(result)
    kill = result["kill"]
    samples = [x for x in result["samples"] if x["t"] >= s["warmup_s"]]
    if not kill.get("t"):
        return {"steady": samples}
    back = kill.get("replaced_t") or kill["t"]
    return {
        "before the kill": [x for x in samples if x.get("until", x["t"]) < kill["t"]],
        "after the kill": [x for x in samples if x["t"] >= back + s["settle_s"]],
    }


def traffic_figures(result: Mapping[str, Any]) -> dict[str, Any]:
    traffic = result["traffic"]
    statuses = {k: {int(c): n for c, n in v.items()} for k, v in traffic["statuses"].items()}
    valid, bad = statuses.get("valid", {}), statuses.get("bad", {})
    before, after = result["counts_before"], result["counts_after"]
    sent = sum(valid.values()) + sum(bad.values())
    return {
        "sent": sent,
        "valid": sum(valid.values()),
        "bad": sum(bad.values()),
        "served": valid.get(200, 0),
        "bad_4xx": sum(n for c, n in bad.items() if 400 <= c < 500),
        "unexpected": len(traffic["unexpected"]),
        "hookwatch": after["hookwatch_requests"] - before["hookwatch_requests"],
        "rejected": after["hookwatch_rejected"] - before["hookwatch_rejected"],
        "torchserve": after["torchserve_requests"] - before["torchserve_requests"],
        "before_equal": before["hookwatch_requests"] == before["torchserve_requests"],
    }


def check(result: Mapping[str, Any]) -> list[str]:
    """What does not hold, one line each; empty when the soak passed."""
    s = _settings(result)
    problems: list[str] = []
    f = traffic_figures(result)
    kill = result["kill"]
    if not kill.get("t"):
        problems.append("no worker was killed")
    elif kill.get("replaced_t") is None:
        problems.append(f"worker {kill['pid']} killed at {kill['t']} s was never replaced")
    late = [
        u
        for u in result["traffic"]["unexpected"]
        if not kill.get("t") or not 0 <= u[0] - kill["t"] <= KILL_ERROR_WINDOW_S
    ]
    if late:
        problems.append(f"unexpected answers away from the kill: {late[:5]}")
    if f["unexpected"] > KILL_ERRORS:
        problems.append(
            f"{f['unexpected']} unexpected answers around the kill, expected at most "
            f"{KILL_ERRORS}: {result['traffic']['unexpected'][:5]}"
        )
    if not f["before_equal"]:
        problems.append(f"counts differed before the soak: {result['counts_before']}")
    if f["torchserve"] != f["sent"]:
        problems.append(f"TorchServe counted {f['torchserve']:g} of {f['sent']} requests sent")
    gap = f["torchserve"] - f["hookwatch"]
    if not 0 <= gap <= f["unexpected"]:
        problems.append(
            f"hookwatch counted {f['hookwatch']:g} of {f['sent']} requests sent (TorchServe "
            f"{f['torchserve']:g}); only requests answered with an error may be missing"
        )
    # A bad request in flight when the worker is killed can be rejected (and counted) while
    # its answer is the kill's error: only such requests may be counted without a 4xx.
    lost_bad = sum(1 for u in result["traffic"]["unexpected"] if u[1] == "bad")
    if not 0 <= f["rejected"] - f["bad_4xx"] <= lost_bad:
        problems.append(
            f"hookwatch counted {f['rejected']:g} rejects, expected {f['bad_4xx']} (bad requests "
            f"answered 4xx) plus at most {lost_bad} (bad requests answered with an error)"
        )
    judged_apart = {f"worker {pid}" for pid in {kill.get("pid"), *_late_workers(result)}}
    for name, (rss, fds) in process_fits(result).items():
        if name in judged_apart and (rss is None or fds is None):
            continue  # the killed worker or its replacement: too short a window to judge
        if rss is None or fds is None:
            problems.append(f"{name}: fewer than {MIN_POINTS} samples in its window")
            continue
        if rss.slope > s["rss_bound_mib_per_10min"]:
            problems.append(
                f"{name}: RSS grew {rss.slope:.2f} MiB per 10 min (bound "
                f"{s['rss_bound_mib_per_10min']:g})"
            )
        if fds.slope > s["fd_bound_per_10min"]:
            problems.append(
                f"{name}: open fds grew {fds.slope:.2f} per 10 min (bound "
                f"{s['fd_bound_per_10min']:g})"
            )
    stretches = phases(result)
    for what in ("files", "series"):
        levels = set()
        for phase, samples in stretches.items():
            values = {x[what] for x in samples}
            if len(samples) < 2:
                problems.append(f"{what}: fewer than 2 samples {phase}")
            elif len(values) != 1:
                problems.append(f"{what} {phase}: not constant, {sorted(values)}")
            levels |= values
        if what == "series" and len(levels) > 1:
            problems.append(f"series: {sorted(levels)} before and after the kill")
    return problems


# -- rendering ----------------------------------------------------------------------------------


def _n(x: float) -> str:
    return f"{x:,.0f}"


def _quick_form(s: Mapping[str, Any]) -> str:
    """What the 1-minute form that ``make test`` runs is held to, said in the full soak's
    report: its bounds are looser (a fit over well under a minute is noisy), so it passing
    says less than this run passing. Empty in the quick form's own report."""
    from dev.soak.runner import Settings

    q = Settings.quick()
    if s["rss_bound_mib_per_10min"] >= q.rss_bound_mib_per_10min:
        return ""
    rss = q.rss_bound_mib_per_10min / s["rss_bound_mib_per_10min"]
    fds = q.fd_bound_per_10min / s["fd_bound_per_10min"]
    looser = f"{rss:g} times" if rss == fds else f"{rss:g} (RSS) and {fds:g} (descriptors) times"
    return (
        f"`make test` runs a {q.seconds:g} s form of this soak "
        "(`tests/integration/test_soak.py`, `Settings.quick` in `dev/soak/runner.py`) with "
        f"the same checks and bounds {looser} looser: RSS at most "
        f"{q.rss_bound_mib_per_10min:g} MiB and open file descriptors at most "
        f"{q.fd_bound_per_10min:g} more per 10 minutes, fitted from {q.warmup_s:g} s on. Its "
        "fits span well under a minute and are noisy: it catches a fast leak or a lost count; "
        "only this run tells a slow leak."
    )


def render(result: Mapping[str, Any], plots: Sequence[str] = PLOTS) -> str:
    s = _settings(result)
    f = traffic_figures(result)
    kill = result["kill"]
    cap = result["capacity"]
    traffic = result["traffic"]
    problems = check(result)
    m = result["machine"]
    out: list[str] = []
    add = out.append
    add("# Soak")
    add("")
    add(
        "<!-- Generated by `make soak` (`python -m dev soak`) from soak.json; "
        "tests/unit/test_soak_report.py checks this file against it. -->"
    )
    add("")
    add(
        f"The native stack (TorchServe with the demo CNN and {s['workers']} workers, the "
        "hookwatch exporter, Prometheus scraping every "
        f"{s['scrape_interval']}) for {s['seconds']:g} s at {100 * s['load']:.0f} % of the "
        f"capacity measured just before, one request in {result['bad_every']} a bad one, one "
        f"worker killed with SIGKILL {100 * s['kill_at']:.0f} % of the way. Run "
        f"{result['started']} on {m['cpu']} ({m['cores']} cores, shared), torch {m['torch']}, "
        f"TorchServe {m['torchserve']}."
    )
    add("")
    add("**Verdict: " + ("passed.**" if not problems else "failed.**"))
    for problem in problems:
        add(f"- {problem}")
    add("")
    add("## Traffic and counts")
    add("")
    add("| | |")
    add("|---|---|")
    add(
        f"| capacity (closed loop, {cap['clients']} clients, {cap['seconds']:g} s, valid "
        f"requests) | {cap['requests_per_s']:.1f} requests/s (p50 {cap['p50_ms']:.1f} ms, p99 "
        f"{cap['p99_ms']:.1f} ms) |"
    )
    add(
        f"| offered (open loop, {s['senders']} senders) | {result['offered_per_s']:.1f} "
        f"requests/s ({100 * s['load']:.0f} %); {traffic['late']} sends more than 50 ms "
        "behind schedule |"
    )
    add(
        f"| requests sent | {_n(f['sent'])}: {_n(f['valid'])} valid, {_n(f['bad'])} bad "
        f"({', '.join(result['bad_kinds'])}, in turn) |"
    )
    add(f"| valid answered 200 | {_n(f['served'])} |")
    add(f"| bad answered 4xx | {_n(f['bad_4xx'])} |")
    unexpected = ", ".join(
        f"{k} {c or 'no answer'} at {t:.1f} s" for t, k, c in traffic["unexpected"]
    )
    add(f"| anything else | {f['unexpected']}{': ' + unexpected if unexpected else ''} |")
    if kill.get("t"):
        back = kill.get("replaced_t")
        add(
            f"| worker killed | pid {kill['pid']} at {kill['t']:.1f} s; "
            + (
                f"all {s['workers']} workers ready again by {back:.1f} s |"
                if back
                else "never replaced |"
            )
        )
    add(
        f"| latency of valid requests (from their scheduled send) | p50 "
        f"{traffic['latency_ms']['p50']:.1f} ms, p99 {traffic['latency_ms']['p99']:.1f} ms, max "
        f"{traffic['latency_ms']['max']:.0f} ms |"
    )
    add(f"| TorchServe counted (`ts_inference_requests_total`) | {_n(f['torchserve'])} |")
    gap = f["torchserve"] - f["hookwatch"]
    add(
        f"| hookwatch counted (`hookwatch_requests_total`) | {_n(f['hookwatch'])}"
        + (
            f" ({gap:g} fewer: requests the frontend handed to the killed worker's socket, "
            "answered with an error, which no handler read)"
            if gap
            else ""
        )
        + " |"
    )
    extra = f["rejected"] - f["bad_4xx"]
    add(
        f"| hookwatch rejects (`hookwatch_requests_rejected_total`) | {_n(f['rejected'])}"
        + (
            f" ({extra:g} more than bad answered 4xx: bad requests rejected by the killed "
            "worker, whose answer was the kill's error)"
            if extra > 0
            else ""
        )
        + " |"
    )
    add("")
    add(
        "Counts are the counters' increase over the soak (the capacity run's requests are "
        "before it, where hookwatch's and TorchServe's totals were "
        + ("equal" if f["before_equal"] else "**not** equal")
        + ")."
    )
    add("")
    add("## Flat")
    add("")
    add(
        f"Sampled every {s['sample_s']:g} s. Each process is fitted with a straight line from "
        f"{s['warmup_s']:g} s on (a worker that replaced the killed one from {s['settle_s']:g} s "
        "after it appeared) to its last sample. Bounds: RSS at most "
        f"{s['rss_bound_mib_per_10min']:g} MiB and open file descriptors at most "
        f"{s['fd_bound_per_10min']:g} more per 10 minutes; metric files and series constant "
        "before the kill and again after it (from "
        f"{s['settle_s']:g} s after the replacement was ready)."
    )
    quick = _quick_form(s)
    if quick:
        add("")
        add(quick)
    add("")
    add(
        "| process | window | samples | RSS first → last (range) | RSS slope | fds (range) "
        "| fds slope |"
    )
    add("|---|---|---|---|---|---|---|")
    for name, (rss, fds) in process_fits(result).items():
        if rss is None or fds is None:
            add(f"| {name} | | fewer than {MIN_POINTS} | | | | |")
            continue
        add(
            f"| {name} | {rss.start_t:.0f}-{rss.end_t:.0f} s | {rss.points} | {rss.first:.1f} → "
            f"{rss.last:.1f} MiB ({rss.low:.1f}-{rss.high:.1f}) | {rss.slope:+.2f} MiB/10 min | "
            f"{fds.first:.0f} → {fds.last:.0f} ({fds.low:.0f}-{fds.high:.0f}) | "
            f"{fds.slope:+.2f}/10 min |"
        )
    add("")
    add("| | " + " | ".join(phases(result)) + " |")
    add("|---|" + "---|" * len(phases(result)))
    for what, label in (("files", "metric files (`*.db`)"), ("series", "series on the exporter")):
        cells = []
        for samples in phases(result).values():
            values = sorted({x[what] for x in samples})
            cells.append(" / ".join(str(v) for v in values) if values else "-")
        add(f"| {label} | " + " | ".join(cells) + " |")
    add("")
    add(
        "The dead worker's files are folded into one archive file per type at the exporter's "
        "next scrape, so the file count after the kill is the live workers' files plus the "
        "archive; the series are the same set."
    )
    add("")
    for plot in plots:
        add(f"![{plot.removesuffix('.png')}]({plot})")
        add("")
    return "\n".join(out)


def plot(result: Mapping[str, Any], directory: Path) -> list[Path]:
    """The PNGs the README shows: per process RSS and fds; files, series and traffic."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    kill = result["kill"]
    t = [x["t"] for x in samples]

    def mark(ax: Any) -> None:
        if kill.get("t"):
            ax.axvline(kill["t"], color="red", linestyle="--", linewidth=1, label="worker killed")

    fig, (ax_rss, ax_fds) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    names: dict[str, list[tuple[float, float, float]]] = {}
    for x in samples:
        for pid, (rss, fds) in x["workers"].items():
            names.setdefault(f"worker {pid}", []).append((x["t"], rss, fds))
        if x["exporter"] is not None:
            names.setdefault("exporter", []).append((x["t"], *x["exporter"]))
    for name, points in names.items():
        ax_rss.plot([p[0] for p in points], [p[1] for p in points], label=name)
        ax_fds.plot([p[0] for p in points], [p[2] for p in points], label=name)
    ax_rss.set_ylabel("RSS (MiB)")
    ax_fds.set_ylabel("open file descriptors")
    ax_fds.set_xlabel("seconds into the soak")
    for ax in (ax_rss, ax_fds):
        mark(ax)
        ax.grid(alpha=0.3)
    ax_rss.legend(fontsize=8, loc="best")
    ax_rss.set_title("TorchServe workers and the hookwatch exporter")
    fig.tight_layout()
    paths = [directory / PLOTS[0]]
    fig.savefig(paths[0], dpi=100, metadata={"Software": None})
    plt.close(fig)

    fig, (ax_files, ax_series, ax_rate) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    ax_files.plot(t, [x["files"] for x in samples], drawstyle="steps-post")
    ax_files.set_ylabel("metric files")
    ax_series.plot(t, [x["series"] for x in samples], drawstyle="steps-post")
    ax_series.set_ylabel("series on the exporter")
    per = result["traffic"]["per_interval"]
    ax_rate.plot([p["t"] for p in per], [p["answered_per_s"] for p in per], label="answered/s")
    ax_rate.axhline(result["offered_per_s"], color="gray", linestyle=":", label="offered/s")
    ax_rate.set_ylabel("requests/s")
    ax_p99 = ax_rate.twinx()
    ax_p99.plot(
        [p["t"] for p in per],
        [p["p99_ms"] if math.isfinite(p["p99_ms"]) else None for p in per],
        color="tab:orange",
        label="p99 latency (ms)",
    )
    ax_p99.set_ylabel("p99 latency (ms)")
    ax_rate.set_xlabel("seconds into the soak")
    for ax in (ax_files, ax_series, ax_rate):
        mark(ax)
        ax.grid(alpha=0.3)
    lines = ax_rate.get_legend_handles_labels()
    more = ax_p99.get_legend_handles_labels()
    ax_rate.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="lower left")
    ax_files.set_title("Multiprocess directory, exporter, traffic")
    fig.tight_layout()
    paths.append(directory / PLOTS[1])
    fig.savefig(paths[1], dpi=100, metadata={"Software": None})
    plt.close(fig)
    return paths


def write(result: Mapping[str, Any], directory: Path) -> list[str]:
    """soak.json, README.md and the plots into ``directory``; returns :func:`check`'s lines."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "soak.json").write_text(json.dumps(result, indent=1) + "\n")
    return rewrite(directory)


def rewrite(directory: Path) -> list[str]:
    """README.md and the plots again from ``directory``'s soak.json (after a change to how
    they are drawn); returns :func:`check`'s lines."""
    # Read back: the README says what the committed JSON says, nothing more.
    stored = json.loads((directory / "soak.json").read_text())
    plot(stored, directory)
    (directory / "README.md").write_text(render(stored))
    return check(stored)
