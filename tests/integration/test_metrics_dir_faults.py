"""A worker against a read-only, a missing, a full and a filling metrics directory (a small tmpfs
in a mount namespace of its own): it serves on, and no disk fault kills it with SIGBUS (moved
from tests/unit/test_faults.py: it runs tests/integration/metrics_dir_child.py in a process of
its own)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ("missing", "read-only", "full", "fills-up")


def _unshare() -> list[str]:
    """A command prefix that gives the child a mount namespace where it may mount a tmpfs."""
    binary = shutil.which("unshare")
    require(binary is not None, "unshare (util-linux), to mount a small tmpfs without root")
    assert binary is not None
    probe = [binary, "--user", "--map-root-user", "--mount", "true"]
    ok = subprocess.run(probe, capture_output=True).returncode == 0
    require(ok, "user and mount namespaces (unshare --user --map-root-user --mount)")
    return probe[:-1]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_an_unwritable_or_full_metrics_directory_never_stops_serving(
    scenario: str, tmp_path: Path
) -> None:
    """The child serves through the failure, then the directory recovers: no crash (a full
    tmpfs under an mmap'd file used to kill the process with SIGBUS), every answer equal to
    the unmonitored one, and every request counted once the files can be written."""
    mount = tmp_path / "metrics"
    mount.mkdir()
    command = [*_unshare(), sys.executable, "-m", "tests.integration.metrics_dir_child", scenario]
    done = subprocess.run(
        [*command, str(mount)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**_clean_env(), "PROMETHEUS_MULTIPROC_DIR": str(mount / "dir")},
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["answers_equal"], result
    assert result["writable_during"] == 0 and result["writable_after"] == 1, result
    assert result["requests_counted"] == result["requests_sent"], result
    assert result["rejected_counted"] == result["rejected_sent"] > 0, result
    if scenario == "fills-up":
        # Files created before the disk filled keep working; a new series that needs its file
        # to grow is an OSError where it is created, not SIGBUS.
        assert result["growth_error"] == "OSError", result
    else:
        # The load said so once; every publish that could not write counted a fault.
        assert result["warned"] == 1, result
        assert result["faults_all"] >= 1, result


def _clean_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
