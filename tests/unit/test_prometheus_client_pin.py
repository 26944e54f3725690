"""prometheus-client is pinned to the versions hookwatch's metric files were verified on.

``hookwatch._metrics._mmap.ReservedMmapedDict`` subclasses ``prometheus_client.mmap_dict.
MmapedDict`` and reads its private ``_used``, ``_capacity`` and ``_f``; it is installed by
replacing ``prometheus_client.values.MmapedDict``, the count slots write through the map's
``_m`` and ``_positions``, and ``MetricSet.observe_many`` adds to a summary child's ``_count``
and ``_sum``. None of that is public API, and a release that changes it would not fail an
import: it would lose the block reservation (a full disk kills a worker with SIGBUS again) or
write counts to the wrong offsets. So ``pyproject.toml`` bounds the dependency from above, and
these tests fail, saying what to re-verify, when the installed version or the parts used differ.
"""

from __future__ import annotations

import inspect
import os
import tomllib
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version
from prometheus_client import CollectorRegistry, Summary, mmap_dict, multiprocess, utils, values

from hookwatch._metrics import _mmap
from hookwatch._metrics._mmap import ReservedMmapedDict

ROOT = Path(__file__).resolve().parents[2]

#: What to do before widening the bound, in every failure message.
REVERIFY = (
    "hookwatch._metrics._mmap.ReservedMmapedDict subclasses MmapedDict and reads its private "
    "_used/_capacity/_f, replaces prometheus_client.values.MmapedDict, and the count slots "
    "write through _m/_positions. Before widening the bound in pyproject.toml, re-verify on "
    "that version: this file, tests/integration/test_metrics_dir_faults.py (a full and a filling "
    "disk must not kill a worker with SIGBUS), tests/integration/test_counts_processes.py, "
    "tests/unit/test_faults.py and tests/integration/test_workers.py."
)


def requirement() -> Requirement:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = [Requirement(d) for d in project["dependencies"]]
    return next(r for r in found if r.name == "prometheus-client")


def test_the_dependency_has_an_upper_bound() -> None:
    operators = {spec.operator for spec in requirement().specifier}
    assert "<" in operators or "==" in operators or "~=" in operators, (
        f"pyproject.toml's {requirement()} has no upper bound. {REVERIFY}"
    )


def test_the_installed_prometheus_client_is_a_verified_version() -> None:
    installed = Version(version("prometheus-client"))
    allowed = requirement().specifier
    assert allowed.contains(installed, prereleases=True), (
        f"prometheus-client {installed} is installed, outside the versions hookwatch was "
        f"verified on ({allowed}). {REVERIFY}"
    )


def test_the_private_parts_hookwatch_relies_on_are_there(tmp_path: Path) -> None:
    where = f"(prometheus-client {version('prometheus-client')}). {REVERIFY}"
    assert isinstance(getattr(mmap_dict, "_INITIAL_MMAP_SIZE", None), int), (
        f"mmap_dict._INITIAL_MMAP_SIZE is gone {where}"
    )
    assert _mmap.INITIAL_FILE_SIZE == mmap_dict._INITIAL_MMAP_SIZE
    for method in ("_init_value", "write_value", "read_all_values_from_file", "close"):
        assert callable(getattr(mmap_dict.MmapedDict, method, None)), (
            f"MmapedDict.{method} is gone {where}"
        )
    f = ReservedMmapedDict(str(tmp_path / "counter_1.db"))
    try:
        for attribute in ("_f", "_m", "_used", "_capacity", "_positions"):
            assert hasattr(f, attribute), f"MmapedDict has no {attribute} {where}"
        assert isinstance(f._used, int) and isinstance(f._capacity, int), where
        assert isinstance(f._positions, dict), where
    finally:
        f.close()
    # Installed where prometheus-client opens a process's metric files, and looked up there
    # at each open (not bound at its import), so the replacement takes effect.
    assert values.MmapedDict is ReservedMmapedDict, f"values.MmapedDict not replaced {where}"
    assert "MmapedDict(" in inspect.getsource(values.MultiProcessValue), (
        f"values.MultiProcessValue no longer opens files through values.MmapedDict {where}"
    )
    assert hasattr(values, "ValueClass") and hasattr(values, "MutexValue"), where
    assert callable(getattr(multiprocess.MultiProcessCollector, "merge", None)), where
    assert callable(getattr(multiprocess, "mark_process_dead", None)), where
    assert callable(getattr(utils, "floatToGoString", None)), where
    # MetricSet.observe_many adds a bulk count and sum to a summary child's values.
    child = Summary("pin_probe", "probe", registry=CollectorRegistry())
    assert callable(getattr(getattr(child, "_count", None), "inc", None)), where
    assert callable(getattr(getattr(child, "_sum", None), "inc", None)), where


def test_the_file_layout_is_the_one_hookwatch_reserves_for(tmp_path: Path) -> None:
    """The entry size hookwatch allocates ahead of prometheus-client's own growth is the size
    prometheus-client then uses, and every growth lands on blocks already allocated."""
    path = tmp_path / "counter_2.db"
    f = ReservedMmapedDict(str(path))
    try:
        keys = [f'["m", "m_total", {{"model": "{i:0{i % 40}d}"}}, "h"]' for i in range(3000)]
        for key in keys:
            used = f._used
            f.write_value(key, 1.0, 0.0)
            assert f._used - used == _mmap._entry_size(key), (
                f"an entry's size changed in prometheus-client {version('prometheus-client')}. "
                f"{REVERIFY}"
            )
        assert f._capacity > _mmap.INITIAL_FILE_SIZE  # it grew
        size = os.stat(path)
        assert size.st_size == f._capacity
        assert size.st_blocks * 512 >= f._capacity, "the grown file's blocks are not allocated"
    finally:
        f.close()
    read = {key for key, *_ in ReservedMmapedDict.read_all_values_from_file(str(path))}
    assert read == set(keys)
