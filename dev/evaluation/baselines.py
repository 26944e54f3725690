"""Baselines for ``make eval-drift``: alibi-detect's drift tests, run as a script.

    python baselines.py JOB.npz [JOB.npz ...]

Standalone on purpose (numpy, scipy, torch, alibi-detect; no hookwatch import): it runs in
``.venv-eval``, whose numpy<2 pin alibi-detect 0.13 needs. alibi-detect is a benchmark-side
dependency only. Each job file is one draw's data (its ``kind`` says which part); the results
go to ``JOB.out.npz`` beside it.

**windows** jobs: for every representation (the input and each watched layer, exactly the
features hookwatch's detectors read) and every window, the tests alibi-detect's ``KSDrift``
and ``MMDDrift`` run:

- KS: a two-sample Kolmogorov-Smirnov test per feature, asymptotic p-values, Bonferroni over
  the features (``KSDrift(correction="bonferroni")``);
- MMD: the unbiased MMD^2 with a Gaussian kernel, bandwidth from the median heuristic on the
  reference, permutation p-value (``MMDDrift(backend="pytorch")``);

and, over the same permutations of each window for every representation, two jointly
calibrated OR-ensembles (Westfall-Young: a permutation test of the most extreme statistic
over representations, so their correlation is used rather than paid for): KS-OR on the
smallest Bonferroni p-value, MMD-OR on the largest standardised MMD^2. Permutations are
vectorised; the first windows of every job are checked against alibi-detect's own ``KSDrift``
and ``MMDDrift`` and the script stops if they disagree.

**text** jobs: the sentence embeddings of the text section, KS and MMD per window.

**online** jobs: alibi-detect's ``CVMDriftOnline`` on the softmax and ``MMDDriftOnline`` on the
penultimate layer, configured for one expected run time, on streams of clean then shifted
samples (the sample of the first detection) and on a long clean stream (detections, each
followed by a reset).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

#: Per-window checks against alibi-detect's own classes, at the start of every job.
CHECKED_WINDOWS = 2


def _alibi() -> Any:
    try:
        import alibi_detect
    except ImportError as error:
        raise SystemExit(
            f"expected alibi-detect in {sys.executable} (make eval-drift installs it into "
            f".venv-eval), got {error}"
        ) from None
    return alibi_detect


def _ks_max_distance(pooled: Any, assign: Any, n: int) -> Any:
    """Largest KS distance over features, ``[P]``, for each assignment row of ``assign``
    ``[P, N]`` (True: reference side). Evaluated at the end of every run of tied values, which
    is where scipy's ``ks_2samp`` evaluates both empirical CDFs."""
    total, _ = pooled.shape
    m = total - n
    order = np.argsort(pooled, axis=0, kind="stable")
    ordered = np.take_along_axis(pooled, order, axis=0)
    ends = np.ones(pooled.shape, dtype=bool)
    ends[:-1] = ordered[1:] != ordered[:-1]
    best = np.zeros(assign.shape[0])
    # A feature at a time keeps the [P, N] temporaries small.
    for f in range(pooled.shape[1]):
        cum_ref = np.cumsum(assign[:, order[:, f]], axis=1, dtype=np.int64)
        cum_win = np.arange(1, total + 1)[None, :] - cum_ref
        gap = np.abs(cum_ref / n - cum_win / m)[:, ends[:, f]]
        best = np.maximum(best, gap.max(axis=1))
    return best


def _ks_pvalue(distance: float, features: int, n: int, m: int) -> float:
    """KSDrift's Bonferroni p-value: features x the asymptotic p-value of the largest
    distance (every feature has the same sample sizes, so it has the smallest p-value)."""
    from scipy.stats import kstwo

    return min(1.0, features * float(kstwo.sf(distance, np.round(n * m / (n + m)))))


def _ks_or_pvalue(distances: Any, features: list[int], n: int, m: int) -> float:
    """Westfall-Young p-value of the smallest Bonferroni KS p-value over representations.

    ``distances`` is ``[P + 1, R]``: the observed split's largest distances, then each
    permutation's. Each representation's p-value falls as its distance grows, so a permutation
    is at least as extreme as the observed split when, for some representation, its distance
    reaches the smallest one that would give a p-value as small: found by bisection over the
    permutations' own distances, a handful of (slow) exact p-values per window.
    """
    observed = min(_ks_pvalue(d, f, n, m) for d, f in zip(distances[0], features, strict=True))
    permuted = distances[1:]
    if observed >= 1.0:
        return 1.0
    extreme = np.zeros(len(permuted), dtype=bool)
    for r, f in enumerate(features):
        values = np.unique(permuted[:, r])
        lo, hi = 0, len(values)
        while lo < hi:
            mid = (lo + hi) // 2
            if _ks_pvalue(values[mid], f, n, m) <= observed:
                hi = mid
            else:
                lo = mid + 1
        if lo < len(values):
            extreme |= permuted[:, r] >= values[lo]
    return float(extreme.mean())


class _Kernel:
    """alibi-detect's Gaussian RBF kernel with MMDDrift's bandwidth (the median heuristic on
    the reference, set once)."""

    def __init__(self, ref: Any) -> None:
        import torch
        from alibi_detect.utils.pytorch.kernels import GaussianRBF

        self._torch = torch
        self.kernel = GaussianRBF()
        x = torch.from_numpy(ref)
        self.k_ref = self.kernel(x, x, infer_sigma=True)

    def pooled(self, ref: Any, window: Any) -> Any:
        torch = self._torch
        x, y = torch.from_numpy(ref), torch.from_numpy(window)
        k_xy = self.kernel(x, y)
        k_yy = self.kernel(y, y)
        k = torch.cat([torch.cat([self.k_ref, k_xy], 1), torch.cat([k_xy.T, k_yy], 1)], 0)
        k = k - torch.diag(k.diag())
        return k.double().numpy()


def _mmd2(kernel: Any, assign: Any, n: int) -> Any:
    """Unbiased MMD^2 (alibi-detect's ``mmd2_from_kernel_matrix``) for each assignment row,
    as quadratic forms of the zero-diagonal kernel matrix."""
    m = kernel.shape[0] - n
    a = assign.astype(np.float64)
    rows = kernel.sum(axis=1)
    a_k_a = np.einsum("pi,pi->p", a @ kernel, a)
    a_k_1 = a @ rows
    a_k_b = a_k_1 - a_k_a
    b_k_b = rows.sum() - 2 * a_k_1 + a_k_a
    return a_k_a / (n * (n - 1)) + b_k_b / (m * (m - 1)) - 2 * a_k_b / (n * m)


def _assignments(n: int, m: int, permutations: int, rng: np.random.Generator) -> Any:
    """Row 0: the observed split (reference first); rows 1..: random permutations."""
    total = n + m
    assign = np.zeros((permutations + 1, total), dtype=bool)
    assign[0, :n] = True
    order = rng.permuted(np.tile(np.arange(total), (permutations, 1)), axis=1)
    np.put_along_axis(assign[1:], order[:, :n], True, axis=1)
    return assign


def _check_against_alibi(
    reps: list[str], refs: dict[str, Any], window: dict[str, Any], ks: Any, mmd: Any, p_val: float
) -> None:
    from alibi_detect.cd import KSDrift, MMDDrift

    for r, rep in enumerate(reps):
        detector = KSDrift(refs[rep], p_val=p_val, correction="bonferroni")
        p, _ = detector.feature_score(refs[rep], window[rep])
        theirs = min(1.0, len(p) * float(p.min()))
        if not np.isclose(theirs, ks[r], rtol=1e-3, atol=1e-6):
            raise SystemExit(f"KS on {rep}: expected alibi-detect's p {theirs}, got {ks[r]}")
        _, distance, _ = MMDDrift(
            refs[rep], backend="pytorch", p_val=p_val, n_permutations=1
        ).score(window[rep])
        if not np.isclose(distance, mmd[r], rtol=1e-3, atol=1e-6):
            raise SystemExit(f"MMD on {rep}: expected alibi-detect's {distance}, got {mmd[r]}")


def _window_sets(data: dict[str, Any]) -> Iterator[tuple[str, Any, np.random.Generator]]:
    """Each window size of a job, its windows and its permutations' generator (seeded by the
    draw and the size, so a job's p-values do not depend on which sizes it holds)."""
    for key in sorted(k for k in data if k.startswith("windows_")):
        w = key.removeprefix("windows_")
        yield w, data[key], np.random.default_rng(int(data["seed"]) * 1000 + int(w))


def windows_job(data: dict[str, Any]) -> dict[str, Any]:
    reps = [str(r) for r in data["reps"]]
    refs = {r: data[f"ref_{r}"].astype(np.float32) for r in reps}
    pools = {r: data[f"pool_{r}"].astype(np.float32) for r in reps}
    p_val = float(data["p_val"])
    permutations = int(data["permutations"])
    kernels = {r: _Kernel(refs[r]) for r in reps}
    features = [refs[r].shape[1] for r in reps]
    out: dict[str, Any] = {}
    checked = 0
    for w, windows, rng in _window_sets(data):
        n = len(refs[reps[0]])
        ks = np.empty((len(windows), len(reps)))
        mmd = np.empty((len(windows), len(reps)))
        ks_or = np.empty(len(windows))
        mmd_or = np.empty(len(windows))
        started = time.perf_counter()
        for i, index in enumerate(windows):
            assign = _assignments(n, len(index), permutations, rng)
            distances = np.empty((permutations + 1, len(reps)))
            mmd_all = np.empty((permutations + 1, len(reps)))
            window = {r: pools[r][index] for r in reps}
            for j, r in enumerate(reps):
                pooled = np.concatenate([refs[r], window[r]])
                distances[:, j] = _ks_max_distance(pooled, assign, n)
                mmd_all[:, j] = _mmd2(kernels[r].pooled(refs[r], window[r]), assign, n)
            m = len(index)
            ks[i] = [_ks_pvalue(d, f, n, m) for d, f in zip(distances[0], features, strict=True)]
            if i < CHECKED_WINDOWS:
                _check_against_alibi(reps, refs, window, ks[i], mmd_all[0], p_val)
                checked += 1
            # MMDDrift's p-value: the share of permuted MMD^2 at least as large.
            mmd[i] = (mmd_all[1:] >= mmd_all[0]).mean(axis=0)
            ks_or[i] = _ks_or_pvalue(distances, features, n, m)
            z = (mmd_all - mmd_all[1:].mean(axis=0)) / np.maximum(mmd_all[1:].std(axis=0), 1e-300)
            largest = z.max(axis=1)
            mmd_or[i] = (largest[1:] >= largest[0]).mean()
        out.update({f"ks_{w}": ks, f"mmd_{w}": mmd, f"ks_or_{w}": ks_or, f"mmd_or_{w}": mmd_or})
        print(
            f"baselines seed {int(data['seed'])} W={w}: {len(windows)} windows in "
            f"{time.perf_counter() - started:.0f} s",
            flush=True,
        )
    out["checked"] = np.int64(checked)
    return out


def text_job(data: dict[str, Any]) -> dict[str, Any]:
    """The text section's windows on one representation (the sentence embeddings): per window,
    ``KSDrift``'s Bonferroni p-value (asymptotic, no permutations) and ``MMDDrift``'s
    permutation p-value."""
    ref = data["ref"].astype(np.float32)
    pool = data["pool"].astype(np.float32)
    p_val = float(data["p_val"])
    permutations = int(data["permutations"])
    kernel = _Kernel(ref)
    n, features = ref.shape
    out: dict[str, Any] = {}
    checked = 0
    for w, windows, rng in _window_sets(data):
        ks = np.empty(len(windows))
        mmd = np.empty(len(windows))
        for i, index in enumerate(windows):
            window = pool[index]
            m = len(index)
            assign = _assignments(n, m, permutations, rng)
            distance = _ks_max_distance(np.concatenate([ref, window]), assign[:1], n)[0]
            ks[i] = _ks_pvalue(float(distance), features, n, m)
            mmd2 = _mmd2(kernel.pooled(ref, window), assign, n)
            mmd[i] = (mmd2[1:] >= mmd2[0]).mean()
            if i < CHECKED_WINDOWS:
                _check_against_alibi(
                    ["embedding"], {"embedding": ref}, {"embedding": window}, ks[i : i + 1],
                    mmd2[:1], p_val,
                )  # fmt: skip
                checked += 1
        out.update({f"ks_{w}": ks, f"mmd_{w}": mmd})
    out["checked"] = np.int64(checked)
    return out


def _first_detection(detector: Any, samples: Any, start: int) -> tuple[int, int]:
    """Feed ``samples`` one at a time; (position of the first detection at or after ``start``
    or -1, detections before ``start``). A detection before ``start`` resets the detector."""
    detector.reset_state()
    early = 0
    for t, x in enumerate(samples):
        if detector.predict(x)["data"]["is_drift"]:
            if t >= start:
                return t, early
            early += 1
            detector.reset_state()
    return -1, early


def online_job(data: dict[str, Any]) -> dict[str, Any]:
    import torch
    from alibi_detect.cd import CVMDriftOnline, MMDDriftOnline

    torch.manual_seed(int(data["seed"]))
    np.random.seed(int(data["seed"]))
    ert, window = float(data["ert"]), int(data["window"])
    detectors = {
        "cvm": (
            CVMDriftOnline(
                data["ref_output"].astype(np.float32),
                ert=ert,
                window_sizes=[window],
                n_bootstraps=int(data["cvm_bootstraps"]),
                verbose=False,
            ),
            data["pool_output"].astype(np.float32),
        ),
        "mmd": (
            MMDDriftOnline(
                data["ref_penultimate"].astype(np.float32),
                ert=ert,
                window_size=window,
                backend="pytorch",
                n_bootstraps=int(data["mmd_bootstraps"]),
                verbose=False,
            ),
            data["pool_penultimate"].astype(np.float32),
        ),
    }
    prefix = int(data["prefix"])
    out: dict[str, Any] = {}
    started = time.perf_counter()
    for name, (detector, pool) in detectors.items():
        streams = data["streams"]
        first = np.empty(len(streams), dtype=np.int64)
        early = np.empty(len(streams), dtype=np.int64)
        for i, stream in enumerate(streams):
            first[i], early[i] = _first_detection(detector, pool[stream], prefix)
        out[f"{name}_first"] = first
        out[f"{name}_early"] = early
        detector.reset_state()
        alarms = 0
        for x in pool[data["clean"]]:
            if detector.predict(x)["data"]["is_drift"]:
                alarms += 1
                detector.reset_state()
        out[f"{name}_clean_alarms"] = np.int64(alarms)
    print(
        f"online baselines seed {int(data['seed'])}: {time.perf_counter() - started:.0f} s",
        flush=True,
    )
    return out


def main(argv: list[str]) -> int:
    alibi = _alibi()
    import torch

    torch.set_num_threads(1)
    for job in argv[1:]:
        data = dict(np.load(job))
        kind = str(data["kind"])
        jobs = {"windows": windows_job, "text": text_job, "online": online_job}
        out = jobs[kind](data)
        out["impl"] = np.frombuffer(f"alibi-detect {alibi.__version__}".encode(), dtype=np.uint8)
        np.savez(Path(job).with_suffix(".out.npz"), **out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
