"""Baseline detectors for ``make eval-drift``, run as a script in the benchmark environment.

    python baselines.py IN.npz OUT.npz [W,W,...]

Standalone on purpose (numpy, scipy and, when installed, alibi-detect; no hookwatch import): it
runs in ``.venv-eval``, whose numpy<2 pin alibi-detect 0.13 needs. alibi-detect is a
benchmark-side dependency only. Without it the same two tests run on scipy/numpy and the
output says so.

IN holds ``ref_softmax``, ``ref_penultimate``, ``pool_softmax``, ``pool_penultimate`` (every
scenario's samples, concatenated) and, per window size W, ``windows_W`` (``[N, W]`` indices
into the pool) plus ``p_val``. OUT holds ``ks_W`` and ``mmd_W`` (0/1 per window) and ``impl``.
With a list of window sizes only those run, so several processes can share the sizes; each size
reseeds the permutation tests with W, so a result does not depend on which process ran it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

N_PERMUTATIONS = 100


Detectors = tuple[Callable[[Any], int], Callable[[Any], int], str, Callable[[int], None]]


def _alibi(ref_sm: Any, ref_pen: Any, p_val: float) -> Detectors:
    import torch

    torch.set_num_threads(1)
    from alibi_detect.cd import KSDrift, MMDDrift  # type: ignore[import-not-found]

    ks = KSDrift(ref_sm, p_val=p_val, correction="bonferroni")
    mmd = MMDDrift(
        ref_pen.astype(np.float32), backend="pytorch", p_val=p_val, n_permutations=N_PERMUTATIONS
    )
    version = __import__("alibi_detect").__version__

    def ks_fn(x: Any) -> int:
        return int(ks.predict(x)["data"]["is_drift"])

    def mmd_fn(x: Any) -> int:
        return int(mmd.predict(x.astype(np.float32))["data"]["is_drift"])

    def reseed(seed: int) -> None:
        # MMDDrift draws its permutations from torch's generator: seeded, a rerun gives the
        # same table.
        torch.manual_seed(seed)

    return ks_fn, mmd_fn, f"alibi-detect {version}", reseed


def _scipy(ref_sm: Any, ref_pen: Any, p_val: float) -> Detectors:
    """KS with Bonferroni and a Gaussian-kernel MMD permutation test, as alibi-detect does."""
    from scipy.spatial.distance import cdist
    from scipy.stats import ks_2samp

    features = ref_sm.shape[1]

    def ks_fn(x: Any) -> int:
        p = [ks_2samp(ref_sm[:, j], x[:, j]).pvalue for j in range(features)]
        return int(min(p) < p_val / features)

    ref = ref_pen.astype(np.float64)
    # Median heuristic on the reference, as alibi-detect's configure_kernel_from_x_ref.
    d_ref = cdist(ref, ref, "sqeuclidean")
    sigma = np.sqrt(np.median(d_ref[np.triu_indices_from(d_ref, 1)]) / 2)
    rng = [np.random.default_rng(0)]

    def reseed(seed: int) -> None:
        rng[0] = np.random.default_rng(seed)

    def mmd2(k: Any, n: int) -> float:
        m = k.shape[0] - n
        kxx = (k[:n, :n].sum() - np.trace(k[:n, :n])) / (n * (n - 1))
        kyy = (k[n:, n:].sum() - np.trace(k[n:, n:])) / (m * (m - 1))
        return float(kxx + kyy - 2 * k[:n, n:].mean())

    def mmd_fn(x: Any) -> int:
        z = np.concatenate([ref, x.astype(np.float64)])
        k = np.exp(-cdist(z, z, "sqeuclidean") / (2 * sigma**2))
        n = len(ref)
        observed = mmd2(k, n)
        null = []
        for _ in range(N_PERMUTATIONS):
            perm = rng[0].permutation(len(z))
            null.append(mmd2(k[np.ix_(perm, perm)], n))
        p = float(np.mean(np.asarray(null) >= observed))
        return int(p < p_val)

    return ks_fn, mmd_fn, "scipy/numpy re-implementation (alibi-detect not installed)", reseed


def main(argv: list[str]) -> int:
    source, target = argv[1], argv[2]
    sizes = set(argv[3].split(",")) if len(argv) > 3 else None
    data = dict(np.load(source))
    ref_sm, ref_pen = data["ref_softmax"], data["ref_penultimate"]
    pool_sm, pool_pen = data["pool_softmax"], data["pool_penultimate"]
    p_val = float(data["p_val"])
    try:
        ks_fn, mmd_fn, impl, reseed = _alibi(ref_sm, ref_pen, p_val)
    except ImportError as error:
        print(f"alibi-detect unavailable ({error}); using the scipy re-implementation", flush=True)
        ks_fn, mmd_fn, impl, reseed = _scipy(ref_sm, ref_pen, p_val)
    out: dict[str, Any] = {"impl": np.frombuffer(impl.encode(), dtype=np.uint8)}
    for key in sorted(k for k in data if k.startswith("windows_")):
        w = key.removeprefix("windows_")
        if sizes is not None and w not in sizes:
            continue
        reseed(int(w))
        windows = data[key]
        started = time.perf_counter()
        out[f"ks_{w}"] = np.array([ks_fn(pool_sm[i]) for i in windows], dtype=np.int8)
        out[f"mmd_{w}"] = np.array([mmd_fn(pool_pen[i]) for i in windows], dtype=np.int8)
        print(
            f"baselines W={w}: {len(windows)} windows in {time.perf_counter() - started:.1f} s",
            flush=True,
        )
    np.savez(target, **out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
