"""docs/metrics.md, generated from the catalogue (``python -m dev catalogue``, ``make docs``)."""

from __future__ import annotations

from hookwatch._catalogue import (
    CATALOGUE,
    EXPORTER_CATALOGUE,
    FLEET_METRICS,
    LABELS,
    MULTIPROCESS_MEANING,
    SERIES_PER_MODEL_TARGET,
    FleetBins,
    GaugeSpec,
    series_per_model,
)

__all__ = ["markdown"]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(
    watched: tuple[str, ...] | list[str], source: str, fleet: FleetBins | None = None
) -> str:
    """docs/metrics.md: every metric, its labels, multiprocess meaning and series count."""
    series = series_per_model(watched, fleet=fleet)
    lines = [
        "# hookwatch metrics",
        "",
        "<!-- Generated from src/hookwatch/_catalogue.py by `python -m dev catalogue > "
        "docs/metrics.md` (`make docs`); tests/unit/test_catalogue.py fails when it is "
        "stale. -->",
        "",
        "Every metric hookwatch exports is defined once, in `src/hookwatch/_catalogue.py`. "
        "TorchServe worker processes write them to files in `PROMETHEUS_MULTIPROC_DIR` "
        "(prometheus-client multiprocess mode); the exporter (`hookwatch exporter`) merges those "
        "files on each scrape. No series carries a `pid` label, so the number of series does not "
        "grow with worker restarts.",
        "",
        "- **Counters and summaries** are summed over every worker process that ever wrote "
        "them, dead ones included, so a fleet-wide `sum()` equals the traffic exactly. The "
        "request counters (requests, sampled, rejected, captures dropped) are written by the "
        "request path as they happen, into a count file of the worker's own: a worker killed "
        "with SIGKILL loses none of them. The request-duration histogram is binned by the "
        "capture thread from what the request path appended (one C call per batch, no Python "
        "frame): its buckets lag by one `flush_interval_s` at most, and a killed worker loses "
        "the durations of its last interval, never a request count. The other counters and "
        "summaries are published by the capture thread every `flush_interval_s` (1 s by "
        "default); under traffic, the "
        "statistics of sampled requests are processed once 128 wait or within 5 s. A scrape "
        "lags by at most that, and a killed worker loses at most that much of them. The exporter "
        "compacts the files of dead workers into one archive file, keeping every total exact.",
        "- **Gauges** use a `live*` multiprocess mode: the exporter drops a dead worker's gauge "
        "files (`mark_process_dead`) before merging, so no stale value stays behind.",
        "- **Summaries** export `_count` and `_sum` only (no quantiles in multiprocess mode): "
        "`rate(x_sum[5m]) / rate(x_count[5m])` is the fleet-wide average over any set of "
        "workers and replicas.",
        "",
        "## Metrics",
        "",
        "| name | type | unit | labels | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for spec in CATALOGUE:
        # _created samples exist only in single-process registries, never on the exporter.
        exposed = ", ".join(f"`{n}`" for n in spec.exposed_names if not n.endswith("_created"))
        name = f"`{spec.name}`" if spec.kind != "summary" else f"`{spec.name}` ({exposed})"
        labels = ", ".join(f"`{label}`" for label in spec.labels)
        lines.append(
            f"| {name} | {spec.kind} | {spec.unit or '1'} | {labels} | {_cell(spec.help)} |"
        )
    lines += [
        "",
        "## The exporter's own",
        "",
        "Computed by `hookwatch exporter` at each scrape, one series per exporter (no `model` "
        "label, not part of the per-model count below).",
        "",
        "| name | type | unit | labels | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for spec in EXPORTER_CATALOGUE:
        unit = spec.unit or "1"
        lines.append(f"| `{spec.name}` | {spec.kind} | {unit} |  | {_cell(spec.help)} |")
    lines += [
        "",
        "## Gauges across worker processes",
        "",
        "| gauge | multiprocess mode | value over workers |",
        "| --- | --- | --- |",
    ]
    for spec in CATALOGUE:
        if isinstance(spec, GaugeSpec):
            meaning = MULTIPROCESS_MEANING.get(spec.multiprocess_mode)
            if meaning is None:
                raise ValueError(
                    f"{spec.name}: expected a live* multiprocess mode "
                    f"({sorted(MULTIPROCESS_MEANING)}), got {spec.multiprocess_mode!r}"
                )
            lines.append(f"| `{spec.name}` | `{spec.multiprocess_mode}` | {meaning} |")
    lines += ["", "## Labels", "", "| label | values |", "| --- | --- |"]
    used = {label for spec in CATALOGUE for label in spec.labels}
    for label in sorted(used):
        if label not in LABELS:
            raise ValueError(f"expected label {label!r} documented in LABELS, got none")
        lines.append(f"| `{label}` | {_cell(LABELS[label])} |")
    layer_list = ", ".join(f"`{w}`" for w in watched)
    lines += [
        "",
        "## Series per model",
        "",
        f"Upper bound on the exporter's scrape for one model watching {len(watched)} layers "
        f"({layer_list}, the defaults of `{source}`). It is the same for any number of workers "
        "and restarts; several models multiply it, several replicas multiply what Prometheus "
        "stores by the replica count (one `instance` each). "
        "`tests/integration/test_workers.py` counts the real series on a live scrape against it.",
        "",
        "The per-bin drift series (`"
        + "`, `".join(FLEET_METRICS)
        + "`) exist for the detectors of `monitoring.drift.fleet_detectors` only"
        + (
            f" ({', '.join(f'`{d}`' for d in fleet.detectors)} here, bounded with "
            f"{fleet.classes} classes, {fleet.bins} bins, max_features {fleet.max_features} "
            f"and fleet_features {fleet.features})"
            if fleet is not None
            else ""
        )
        + ": each detector adds up to features x bins series to each of them, where an input "
        "or hidden-layer detector counts only `fleet_features` of its features (the leading "
        "principal components and the residual of a projected layer), so each layer adds at "
        "most `fleet_features x bins` (see docs/drift.md, Fleet-wide drift).",
        "",
        "| metric | series |",
        "| --- | ---: |",
    ]
    lines += [f"| `{name}` | {count} |" for name, count in series.items()]
    total = sum(series.values())
    lines += [
        f"| **total** | **{total}** |",
        "",
        f"Target: at most {SERIES_PER_MODEL_TARGET} series per model.",
        "",
    ]
    return "\n".join(lines)
