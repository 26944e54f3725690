"""Your own model: discover its layers, write a starting config, archive it with its profile.

``hookwatch layers`` dry-runs the model on an example input and lists every named module with
its output shape, parameters and drift features; ``hookwatch init`` writes a model-config from
that; ``hookwatch archive`` builds the model, runs the reference data through the same input
pipeline and hooks as serving, and writes one ``.mar`` with the handler, the config, the model
description and the drift profile inside.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import inspect
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from numpy.typing import NDArray
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from hookwatch._config import (
    ANSWER_KEYS,
    HandlerConfig,
    InputSpec,
    ModelConfig,
    MonitoringConfig,
    read_model_config,
)
from hookwatch._drift import AccuracyEstimator
from hookwatch._drift.projection import SAMPLES_PER_COMPONENT
from hookwatch._errors import BadInputError, ConfigError, HookwatchError, error_line
from hookwatch._hooks import (
    FeatureReading,
    as_items,
    feature_reading,
    hookable_root,
    joined_inputs,
    module_type,
    per_sample_items,
    plan_watch,
    select_tensor,
    steps_of,
    watchable_modules,
)
from hookwatch._model import (
    MODEL_SPEC_FILE,
    ModelSpec,
    attribute,
    build_model,
    installed_distribution,
    module_name,
    package_root,
    serialized_kind,
)
from hookwatch._names import INPUT_LAYER, OUTPUT_LAYER
from hookwatch._profile.accuracy import MAX_ESTIMATE_GAP
from hookwatch._service import (
    ArgumentsPipeline,
    InputPipeline,
    ModelInputs,
    Padded,
    Pipeline,
    batch_inputs,
    call_model,
    decode_as,
    fits_shape,
    make_pipeline,
)
from hookwatch._text import TextPipeline
from hookwatch.tools.arrays import ARRAY_SUFFIXES, read_arrays
from hookwatch.tools.images import AUDIO_SUFFIXES, IMAGE_SUFFIXES, class_folders, image_files
from hookwatch.tools.labels import LABELS_ARRAY, check_labels, reference_labels

__all__ = [
    "LayerInfo",
    "ModelRef",
    "archive_model",
    "discover_layers",
    "format_layers",
    "init_config",
    "load_reference",
]

#: Activation modules: hooking their output makes zero_fraction read as "share of dead units".
ACTIVATIONS = frozenset(
    {
        "ReLU",
        "ReLU6",
        "LeakyReLU",
        "PReLU",
        "ELU",
        "SELU",
        "CELU",
        "GELU",
        "SiLU",
        "Mish",
        "Hardswish",
        "Hardtanh",
        "Sigmoid",
        "Tanh",
        "Softplus",
    }
)
#: Recurrent and attention blocks (and any class whose name ends in "Attention"): `hookwatch
#: init` proposes them when a model has them.
SEQUENCE_BLOCKS = frozenset(
    {
        "RNN",
        "LSTM",
        "GRU",
        "MultiheadAttention",
        "TransformerEncoderLayer",
        "TransformerDecoderLayer",
    }
)
HANDLER_SOURCE = '''"""Written by `hookwatch archive`; the logic is in hookwatch.torchserve."""

from hookwatch.torchserve import HookwatchHandler


class Handler(HookwatchHandler):
    """The one class TorchServe loads from this file."""
'''


@dataclass(frozen=True)
class ModelRef:
    """``path/file.py:Name`` (an nn.Module class or a factory), ``module.path:Name``, a
    TorchScript file or a ``torch.export`` program (``.pt2``)."""

    path: Path
    name: str = ""
    #: An installed module's name (``module.path:Name`` found in site-packages): a worker
    #: imports it by that name from its own environment; nothing of it is archived.
    module: str = ""

    @classmethod
    def parse(cls, text: str) -> ModelRef:
        file, sep, name = text.rpartition(":")
        # The name may go through classes, as entry points name one (AutoModel.from_pretrained).
        named = bool(name) and all(part.isidentifier() for part in name.split("."))
        if sep and file.endswith(".py") and named:
            path = Path(file)
            if _installed(path) and package_root(path) is not None:
                # A file of an installed package: its module, as module.path:Name names it
                # (a worker imports it from its own environment; none of it is archived).
                return cls(path, name, module_name(path))
            return cls(path, name)
        if sep and named and all(p.isidentifier() for p in file.split(".")):
            # module.path:Name, as uvicorn and entry points name one: an installed package's
            # (the serving image's own: imported by name there too) or one under the working
            # directory (archived as a file of its package is).
            path = _module_file(file)
            return cls(path, name, file if _installed(path) else "")
        if not sep and text.endswith(".py"):
            raise ConfigError(
                f"model: expected path/file.py:Name (a class or factory function in the file), "
                f"got {text!r} without a name"
            )
        if not sep:
            return cls(Path(text))
        raise ConfigError(f"model: expected path/file.py:Name or a TorchScript file, got {text!r}")

    @property
    def scripted(self) -> bool:
        return not self.name

    def spec(self, args: Mapping[str, Any], weights: Path | None) -> ModelSpec:
        """A spec with absolute paths, to build the model where it lies."""
        if not self.path.is_file():
            raise ConfigError(f"model: expected a file at {self.path}, got no such file")
        if self.scripted:
            # Directories only: archived beside the model for what reads them (a tokenizer
            # for input.text), never passed to it.
            others = sorted(
                key
                for key, value in args.items()
                if not (isinstance(value, str) and Path(value).is_dir())
            )
            if others or weights is not None:
                raise ConfigError(
                    "model: a TorchScript or torch.export file holds its weights and takes no "
                    "arguments but directories (a tokenizer for input.text); got "
                    + ("--weights" if weights is not None else f"--model-args {', '.join(others)}")
                )
            return ModelSpec(
                serialized_kind(self.path),
                str(self.path.resolve()),
                args=dict(args),
                directories=tuple(args),
            )
        return ModelSpec(
            "class",  # "factory" is told apart once the name is imported
            str(self.path.resolve()),
            self.name,
            dict(args),
            str(weights.resolve()) if weights is not None else None,
            module=self.module or None,
        )


def _installed(path: Path) -> bool:
    """Whether ``path`` lies in an installed distribution's directory (site-packages), which
    the serving image installs the same way, rather than in the user's own tree."""
    return any(part in ("site-packages", "dist-packages") for part in path.resolve().parts)


def _distribution(module: str) -> str:
    """``name version`` of the distribution that installs ``module``'s top package, or the
    top package's name where none is recorded."""
    found = installed_distribution(module)
    return " ".join(found) if found else module.split(".")[0]


def _module_file(module: str) -> Path:
    """The source file of ``module`` (a package's ``__init__.py``), found as an import would
    find it, the working directory first."""
    import importlib.util

    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError) as error:
        # A parent package missing or failing to import.
        raise ConfigError(
            f"model: expected path/file.py:Name or an importable module.path:Name, got "
            f"{module!r}: {type(error).__name__}: {error_line(error)}"
        ) from None
    finally:
        if added:
            sys.path.remove(cwd)
    origin = found.origin if found is not None else None
    if origin is None or not origin.endswith(".py"):
        got = "no such module" if found is None else f"a module without Python source ({origin})"
        raise ConfigError(
            f"model: expected path/file.py:Name or an importable module.path:Name, got "
            f"{module!r}: {got}"
        )
    return Path(origin)


def load_user_model(
    ref: ModelRef, args: Mapping[str, Any] | None = None, weights: Path | None = None
) -> tuple[nn.Module, ModelSpec]:
    """The user's model on the CPU in eval mode, and the spec it was built from."""
    spec = ref.spec(args or {}, weights)
    model = build_model(spec, Path("/"))
    if not ref.scripted:
        module = sys.modules.get(ref.module or module_name(ref.path))
        target = attribute(module, ref.name)
        kind = "class" if isinstance(target, type) else "factory"
        spec = dataclasses.replace(spec, kind=kind)
    return model, spec


def undeclared_imports(model_file: Path, extra_files: Sequence[Path]) -> list[Path]:
    """Modules imported from the model file's own directory (a sibling ``blocks.py``, a
    package ``layers/``) that ``extra_files`` does not carry into the archive."""
    own = model_file.resolve()
    home = own.parent
    carried = {Path(f).resolve() for f in extra_files}
    package = package_root(own)
    if package is not None:
        # The model's package travels whole; what else it imports by name lies beside it.
        home, own = package.parent, package
    found: list[Path] = []
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        # Absolute and real: some of torch's namespaces carry a bare "_ops.py".
        if not isinstance(path, str) or not os.path.isabs(path) or not os.path.isfile(path):
            continue
        file = Path(path).resolve()
        # A sibling module, or a package directly inside the directory: deeper files (a
        # src/ layout, a virtual environment) are not what the model file imports by name.
        if file.parent == home and file.suffix == ".py":
            source = file
        elif file.name == "__init__.py" and file.parent.parent == home:
            source = file.parent
        else:
            continue
        if source != own and source not in carried and source not in found:
            found.append(source)
    return sorted(found)


#: ``--input-shape``: positive integers, each piece between commas or x's (1,28,28, 3x32x32).
_SHAPE = re.compile(r"\s*0*[1-9][0-9]*\s*(?:[,x]\s*0*[1-9][0-9]*\s*)*")


def parse_shape(text: str) -> tuple[int, ...]:
    # The whole text must match: an empty piece (20,,4) or a stray word (20,4,x) is a typo,
    # never a shape with that dimension left out. Empty: one number a sample, [batch].
    if text == "":
        return ()
    if not _SHAPE.fullmatch(text):
        raise ConfigError(f"--input-shape: expected positive integers like 1,28,28, got {text!r}")
    return tuple(int(part) for part in re.split("[,x]", text))


#: What torch says when a floating input reaches an operation on indices (nn.Embedding,
#: one_hot, gather, index_select, indexing).
_WANTS_INTEGERS = re.compile(r"'indices'|index tensor|for index\b|used as indices must be")


#: What Python says when a forward is called with fewer tensors than it takes.
_MISSING_ARGUMENTS = re.compile(
    r"forward\(\) missing \d+ required (?:positional |keyword-only )?argument"
)


def arguments_hint(error: BaseException, model: nn.Module) -> str:
    """What a dry-run error ends with when the forward wants more tensors than one (``;
    declare each ...``, naming the forward's parameters), else nothing."""
    if not (isinstance(error, TypeError) and _MISSING_ARGUMENTS.search(str(error))):
        return ""
    try:
        parameters = list(inspect.signature(hookable_root(model).forward).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    names = [
        p.name
        for p in parameters
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.default is p.empty
    ]
    which = f" ({', '.join(names)})" if names else ""
    hint = (
        f"; a forward of several tensors{which} takes each as declared under input.arguments "
        "in a model-config (--config), a JSON field each"
    )
    # A sequence model's lengths or padding mask: what a variable-length input gives it.
    given = next((n for n in names[1:] if "len" in n.lower() or "mask" in n.lower()), None)
    if given is not None:
        key = "mask" if "mask" in given.lower() else "lengths"
        hint += (
            f"; for inputs of any length given their {key}, input.shape with a null, "
            f"max_length and {key}: {given}"
        )
    return hint


def parameter_dtype(model: nn.Module) -> str | None:
    """The floating dtype all of ``model``'s floating parameters share where it is not float32
    (a model cast with ``.half()``, ``.to(torch.bfloat16)``, ``.double()``): the input dtype a
    dry run tries when none is given; None otherwise."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if len(dtypes) != 1:
        return None
    (dtype,) = dtypes
    return None if dtype == torch.float32 else str(dtype).removeprefix("torch.")


#: What torch says when an input's floating dtype is not its weights'.
_DTYPE_MISMATCH = re.compile(
    r"same dtype|[Ee]xpected scalar type|expect parameter to have scalar type|"
    r"[Ii]nput type .* should be the same|dtype .* does not match weight dtype"
)


def dtype_hint(error: BaseException, model: nn.Module, given: ModelInputs, fix: str) -> str:
    """What a dry-run error ends with when a floating input met weights of another floating
    dtype (``; the model's parameters are bfloat16: try FIX``), else nothing."""
    wanted = parameter_dtype(model)
    first = _first_tensor(given)
    if wanted is None or first is None or not _DTYPE_MISMATCH.search(str(error)):
        return ""
    if not first.is_floating_point() or str(first.dtype).removeprefix("torch.") == wanted:
        return ""
    return f"; the model's parameters are {wanted}: try {fix.format(wanted)}"


def integer_hint(error: BaseException, given: ModelInputs, fix: str) -> str:
    """What a dry-run error ends with when the model wanted integers and was ``given`` floats
    (``; the model wants integer inputs: try FIX``), else nothing: torch's words alone do
    not say which option to change."""
    if not _WANTS_INTEGERS.search(str(error)):
        return ""
    if isinstance(given, dict):
        # Several arguments: name the float ones, those holding whole numbers only (ids sent
        # as floats) where there are such.
        floats = [name for name, value in given.items() if value.is_floating_point()]
        whole = [name for name in floats if bool((given[name] == given[name].round()).all())]
        floats = whole or floats
        if floats:
            return (
                "; the model wants integer inputs: try dtype: int64 for "
                f"{' or '.join(floats)} in input.arguments"
            )
        return ""
    first = _first_tensor(given)
    if first is not None and first.is_floating_point():
        return f"; the model wants integer inputs: try {fix}"
    return ""


def _first_tensor(given: ModelInputs) -> torch.Tensor | None:
    """The tensor a forward's input starts with: the tensor, a padded batch's values, or the
    first keyword argument's."""
    if isinstance(given, Padded):
        return given.values
    return given if isinstance(given, torch.Tensor) else next(iter(given.values()), None)


def example_input(
    shape: Sequence[int], dtype: str = "float32", low: float = 0.0, high: float = 1.0
) -> torch.Tensor:
    """Two random items of ``shape``, for a dry run."""
    generator = torch.Generator().manual_seed(0)
    if dtype.startswith(("int", "uint")):
        top = max(int(high), 2)
        return torch.randint(int(low), top, (2, *shape), generator=generator).to(
            getattr(torch, dtype)
        )
    return (torch.rand(2, *shape, generator=generator) * (high - low) + low).to(
        getattr(torch, dtype) if dtype != "bool" else torch.float32
    )


def call(model: nn.Module, x: torch.Tensor, argument: str | None) -> Any:
    with torch.inference_mode():
        return model(**{argument: x}) if argument else model(x)


def forward_batches(
    batches: Iterable[ModelInputs], argument: str | None
) -> Iterator[torch.Tensor | Mapping[str, Any] | Padded]:
    """Reference batches as the profile builder calls the model: keyword arguments (a text
    model's tokens, ``input.arguments``), one positional tensor, or under ``input.argument``
    the tensor, or the arguments together as one dict, as that keyword."""
    for batch in batches:
        # A padded batch's values are positional (input.argument is refused beside a null).
        if argument is None or isinstance(batch, Padded):
            yield batch
        else:
            # A copy of a dict: such a forward may add its outputs to the dict it is given.
            yield {argument: dict(batch) if isinstance(batch, dict) else batch}


def _select_choices(output: Any) -> str:
    """What ``output.select`` can name in ``output``: a mapping's keys, a sequence's
    indices."""
    if isinstance(output, Mapping):
        keys = [repr(k) for k, v in output.items() if isinstance(v, torch.Tensor)]
        return f" (its tensors' keys: {', '.join(keys) or 'none'})"
    if isinstance(output, (tuple, list)):
        indices = [str(i) for i, v in enumerate(output) if isinstance(v, torch.Tensor)]
        return f" (of {len(output)} items, tensors at indices {', '.join(indices) or 'none'})"
    return ""


def _first_rows(batch: ModelInputs, rows: int) -> ModelInputs:
    if isinstance(batch, Padded):
        return batch.rows(rows)
    if isinstance(batch, dict):
        return {name: value[:rows] for name, value in batch.items()}
    return batch[:rows]


def _alone_and_together(batch: ModelInputs) -> tuple[ModelInputs, ModelInputs, int, int] | None:
    """A sample alone and padded beside a longer one, its own length and the pair's padded
    length: a padded batch's :meth:`Padded.probe`, or texts by their attention mask. None
    where the batch has nothing to tell them apart (texts all of one length)."""
    if isinstance(batch, Padded):
        probe = batch.probe()
        if probe is None or probe[1].step_mask() is None:
            return None
        alone, together = probe
        return alone, together, int(alone.lengths[0]), int(together.values.shape[1])
    if not isinstance(batch, dict):
        return None
    mask = batch.get("attention_mask")
    if mask is None or mask.dim() != 2 or len(mask) < 2:
        return None
    lengths = mask.bool().sum(1).tolist()
    short = min(range(len(lengths)), key=lengths.__getitem__)
    long_ = max(range(len(lengths)), key=lengths.__getitem__)
    own, longest = int(lengths[short]), int(mask.shape[1])
    if own == longest:
        return None
    keep = mask[short].bool()
    steps = tuple(mask.shape)
    texts_alone = {
        name: value[[short]][:, keep] if tuple(value.shape[:2]) == steps else value[[short]]
        for name, value in batch.items()
    }
    texts_together = {name: value[[short, long_]] for name, value in batch.items()}
    return texts_alone, texts_together, own, longest


def answer_steps(
    pipeline: Pipeline, model: nn.Module, batch: ModelInputs, output: Any
) -> tuple[str, ...] | None:
    """The answered parts (``head``, ``output.also`` keys) with a step per step of the input,
    found by running a sample alone and padded beside a longer one: a part whose second
    dimension is the sample's length alone and the pair's padded length beside it
    (:attr:`ModelSpec.answer_steps`). A fixed number of steps (a decoder's 8) is not one, even
    where a batch's longest happens to be as long. None where that cannot be tried."""
    pair = _alone_and_together(batch)
    if pair is None or output.items is not None:
        return None
    alone, together, own, longest = pair
    try:
        with torch.inference_mode():
            outputs = [call_model(pipeline, model, part) for part in (alone, together)]
    except Exception:
        return None  # a sample the model refuses cut short: guessed per batch, as before
    parts = {"head": output.select, **{str(part): part for part in output.also}}
    stepped = []
    for key, select in parts.items():
        a, t = (select_tensor(out, select) for out in outputs)
        if (
            a is not None
            and t is not None
            and min(a.dim(), t.dim()) >= 2
            and (int(a.shape[1]), int(t.shape[1])) == (own, longest)
        ):
            stepped.append(key)
    return tuple(stepped)


def _describe_inputs(batch: ModelInputs) -> str:
    if isinstance(batch, dict):
        return ", ".join(f"{name} {list(value.shape[1:])}" for name, value in batch.items())
    if isinstance(batch, Padded):
        lengths = ", ".join(map(str, batch.lengths.tolist()))
        padded = f"shape {list(batch.values.shape[1:])} padded (lengths {lengths})"
        if batch.field is None:
            return padded
        return ", ".join(
            f"{name} {padded}" if name == batch.field else f"{name} {list(value.shape[1:])}"
            for name, value in batch.arguments().items()
        )
    return f"shape {list(batch.shape[1:])}"


@dataclass(frozen=True)
class LayerInfo:
    name: str
    type: str
    shapes: tuple[tuple[int, ...], ...]
    parameters: int
    #: Drift features per sample: the channel or unit count (what the hooks keep).
    features: int
    depth: int
    #: Times the module ran in the dry run's forward (a reused module runs more than once).
    calls: int = 1
    #: How its features are read: "256 units (mean over 63 steps)", "64 channels (mean over
    #: 8x8 positions)"; empty where each value of a sample is a feature of its own.
    reading: str = ""
    #: The input row of a model whose input goes straight into an embedding: its row count
    #: (ids from 0 to this less one); 0 otherwise.
    vocabulary: int = 0
    #: Why its rows may not be every sample's (a routed expert, a branch some inputs
    #: take); empty when it ran once per sample of the dry run's batch.
    partial: str = ""
    #: The output row of a model answering one dict of tensors a sample (a detector's
    #: boxes, scores, labels): the dicts' keys; empty otherwise.
    items: tuple[str, ...] = ()
    #: The output row of a model answering a list of one tensor a sample: read under
    #: :data:`LISTED_KEY`, proposed as ``output.items``.
    listed: bool = False
    #: The output row of a tuple, list or dict output: each tensor's index or key, and its
    #: shape per sample (None where it has no row per sample), in the output's order.
    parts: tuple[tuple[int | str, tuple[int, ...] | None], ...] = ()
    #: The output row of a model answering no tensor at all (class names as strings): what
    #: it answered, in words; empty otherwise.
    untensored: str = ""


#: The most values a sample ``init`` proposes answering of an output's other part
#: (``output.also``): a multi-task model's other heads, not its hidden states.
ALSO_LARGEST = 64

#: The key ``init`` proposes for a list of one tensor a sample (``output.items``).
LISTED_KEY = "detections"


def _tensors_per_sample(result: Any, samples: int) -> bool:
    """A dry run's output that is a list of one tensor a sample: a list (or tuple) as long as
    the batch of tensors whose first dimensions are not all the batch's (a model's several
    outputs of a batch each have the batch's rows). A guess for ``init`` to propose, which
    ``archive`` then holds the output to."""
    return (
        samples > 1
        and isinstance(result, list | tuple)
        and len(result) == samples
        and all(isinstance(t, torch.Tensor) and t.dim() >= 1 for t in result)
        and not all(t.shape[0] == samples for t in result)
    )


def _shapes(value: Any, batch: int = 0) -> tuple[tuple[int, ...], ...]:
    """The shapes of the tensors in ``value``, batch-first: a sequence-first ``[T, B, H]``
    (the second dimension alone has the batch's size) is shown as the hooks read it."""
    if isinstance(value, torch.Tensor) and value.is_nested:
        # Watched as each sample's mean over its steps (hooks.nested_means).
        parts = value.unbind()
        return ((len(parts), *parts[0].shape[1:]),) if parts else ()
    if isinstance(value, torch.Tensor):
        shape = tuple(value.shape)
        if len(shape) > 2 and batch and shape[0] != batch and shape[1] == batch:
            shape = (shape[1], shape[0], *shape[2:])
        return (shape,)
    if isinstance(value, PackedSequence):
        # Watched as each sequence's mean over its steps (hooks.packed_means).
        return ((int(value.batch_sizes[0]), *value.data.shape[1:]),)
    items: Any = value.values() if isinstance(value, Mapping) else value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [getattr(value, f.name) for f in dataclasses.fields(value)]
    if isinstance(items, list | tuple) or isinstance(value, Mapping):
        return tuple(s for item in items for s in _shapes(item, batch))
    return ()


def _mark_partial(rows: list[LayerInfo], root: nn.Module, batch: int) -> None:
    """Note the layers whose rows are not the batch's samples on every forward: one whose
    output had another row count than the batch (an expert given the rows routed to it, a
    ``[batch x tokens, H]`` view), and every element, with what it holds, of a
    ``ModuleList``/``ModuleDict`` some of whose elements did not run (experts chosen per
    input: the one that ran here may not run on the next)."""
    ran = {row.name for row in rows if row.shapes}
    skipped: list[str] = []
    for name, module in root.named_modules():
        if isinstance(module, nn.ModuleList | nn.ModuleDict):
            elements = [f"{name}.{key}" if name else key for key, _ in module.named_children()]
            if any(e in ran for e in elements) and not all(e in ran for e in elements):
                skipped.append(name)
    for i, row in enumerate(rows):
        if not row.shapes:
            continue
        head = row.shapes[0]
        if batch and head and head[0] != batch:
            why = f"output has {head[0]} rows, the batch {batch}"
        else:
            owner = next((n for n in skipped if row.name.startswith(n + ".")), None)
            if owner is None:
                continue
            why = f"not all of {owner} ran: chosen per input"
        rows[i] = dataclasses.replace(row, partial=why)


def _features(shape: tuple[int, ...]) -> int:
    return shape[1] if len(shape) >= 2 else 1


def _read(shape: tuple[int, ...], reading: FeatureReading) -> tuple[int, str]:
    """Features per sample of an activation of ``shape`` as the hooks read it, and in words
    (see :func:`hookwatch._hooks.feature_reading`)."""
    if len(shape) < 3:
        return _features(shape), ""
    if 2 < len(shape) <= reading.max_dims:
        count, word, over = shape[-1], "units", shape[1:-1]
    else:
        count, word, over = shape[1], "channels", shape[2:]
    kind = "steps" if len(over) == 1 else "positions"
    return count, f"{count} {word} (mean over {'x'.join(map(str, over))} {kind})"


def discover_layers(
    model: nn.Module, x: ModelInputs, argument: str | None = None, tokens: bool = False
) -> list[LayerInfo]:
    """Every named module with the shapes it output on a dry run of ``x``, in model order.

    ``x`` is a tensor, or keyword arguments (a text model's tokens, ``tokens`` true: its
    features are then what the token-aware hooks keep, a hidden state's last dimension and
    the input's token count). The hooks are temporary and removed whatever happens; a module
    that did not run on this input shows no shape.
    """
    root = hookable_root(model)
    outputs: dict[str, tuple[tuple[int, ...], ...]] = {}
    calls: dict[str, int] = {}
    vocabulary: list[int] = []
    handles = []
    first = _first_tensor(x)
    assert first is not None
    # A batch padded along its samples' first dimension is read as tokens are: step
    # activations [B, T, H] averaged over each sample's own steps.
    tokens = tokens or (isinstance(x, Padded) and x.step_mask() is not None)
    steps = "steps" if isinstance(x, Padded) else "tokens"
    batch = int(first.shape[0]) if first.dim() else 0
    try:
        for name, module in watchable_modules(root).items():
            if not isinstance(module, torch.jit.ScriptModule):

                def hook(_m: nn.Module, _a: Any, out: Any, name: str = name) -> None:
                    outputs[name] = _shapes(out, batch)  # the last call is what a hook watches
                    calls[name] = calls.get(name, 0) + 1

                handles.append(module.register_forward_hook(hook))
                if isinstance(module, nn.Embedding | nn.EmbeddingBag):

                    def ids(
                        _m: nn.Module, args: tuple[Any, ...], rows: int = module.num_embeddings
                    ) -> None:
                        # The input itself, not ids the model derived from it.
                        if args and args[0] is first:
                            vocabulary.append(rows)

                    handles.append(module.register_forward_pre_hook(ids))
        try:
            if isinstance(x, Padded):
                with torch.inference_mode():
                    result = x.call(model)
            elif isinstance(x, dict):
                with torch.inference_mode():
                    # Under input.argument, the arguments together as one dict.
                    result = model(**{argument: dict(x)}) if argument else model(**x)
            else:
                result = call(model, x, argument)
        except Exception as error:
            raise ConfigError(
                f"dry run: expected the model to accept inputs of {_describe_inputs(x)} "
                f"(batch of {first.shape[0]}, dtype {str(first.dtype).removeprefix('torch.')}), "
                f"got {type(error).__name__}: {error_line(error)}"
                + integer_hint(error, first, "--input-dtype int64")
                + dtype_hint(error, model, first, "--input-dtype {}")
                + arguments_hint(error, model)
            ) from None
    finally:
        for handle in handles:
            handle.remove()
    width = _projection_width()
    joined = joined_inputs(x, width) if isinstance(x, dict) and not tokens else None
    given = x
    if isinstance(x, Padded) and x.field is not None:
        # Several arguments, one padded: read side by side, that one by its own steps.
        given = x.arguments()
        joined = joined_inputs(x.call_arguments(), width, steps_of(x))
    shapes: tuple[tuple[int, ...], ...]
    if joined is not None and joined is not first:
        # Several arguments: the hooks read them side by side (input.arguments).
        assert isinstance(given, dict)
        shapes, features = tuple(tuple(v.shape) for v in given.values()), int(joined.shape[1])
    else:
        shapes = (tuple(first.shape),)
        features = _token_input_features(first, width) if tokens else _input_features(first, width)
    rows = [
        LayerInfo(
            INPUT_LAYER,
            "(input)",
            shapes,
            0,
            features,
            0,
            # Ids as the request sent them: the input, or a padded batch's values.
            vocabulary=min(vocabulary)
            if vocabulary and (x is first or (isinstance(x, Padded) and x.field is None))
            else 0,
        )
    ]
    for name, module in watchable_modules(root).items():
        shapes = outputs.get(name, ())
        count, reading = _layer_features(shapes, tokens, root, name, steps)
        rows.append(
            LayerInfo(
                name,
                module_type(module),
                shapes,
                sum(p.numel() for p in module.parameters()),
                count,
                name.count(".") + 1,
                calls.get(name, 0),
                reading,
            )
        )
    _mark_partial(rows, root, batch)
    items: tuple[str, ...] = ()
    listed = _tensors_per_sample(result, int(first.shape[0]) if first.dim() else 0)
    if listed:
        # A list of one tensor a sample (a detector's rows after NMS): proposed as
        # output.items, read as one dict a sample under that key.
        result = as_items(result, LISTED_KEY)
    if per_sample_items(result):
        # One dict a sample (a detector's): watched as each entry's count and mean.
        items = tuple(str(key) for key in result[0])
        out_shapes: tuple[tuple[int, ...], ...] = ((len(result), 2 * len(items)),)
        count, reading = 2 * len(items), f"count and mean of each sample's {', '.join(items)}"
    else:
        out_shapes = _shapes(result, batch)
        count, reading = _layer_features(out_shapes, tokens, root, "", steps)
    rows.append(
        LayerInfo(
            OUTPUT_LAYER,
            "(output)",
            out_shapes,
            sum(p.numel() for p in model.parameters()),
            count,
            0,
            reading=reading,
            items=items,
            listed=listed,
            parts=() if listed or items else _output_parts(result, batch, _tensor_ids(x)),
            untensored="" if out_shapes else _no_tensor(result),
        )
    )
    return rows


#: A model package larger than this is said to be large when archived whole.
_LARGE_PACKAGE = 50 * 2**20


def _no_tensor(value: Any) -> str:
    """``value`` in words where no tensor is in it (``a list of str``), else empty."""
    if _holds_tensor(value):
        return ""
    if isinstance(value, list | tuple) and value:
        kinds = sorted({type(item).__name__ for item in value})
        return f"a {type(value).__name__} of {', '.join(kinds)}"
    if isinstance(value, Mapping):
        return f"a {type(value).__name__} of {', '.join(map(str, list(value)[:5]))}"
    return f"a {type(value).__name__}"


def _holds_tensor(value: Any, depth: int = 4) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if depth <= 0:
        return False
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, list | tuple):
        return any(_holds_tensor(item, depth - 1) for item in value)
    return False


#: What a model answering no tensor is told: the answers and drift are a tensor's.
NO_TENSOR_HINT = (
    "hookwatch answers and watches the tensors a model computes: return the logits, and name "
    "the classes in handler.labels (each request is then answered its class's name)"
)


def _tensor_ids(x: Any) -> frozenset[int]:
    """The identities of the tensors a dry run gave the model (its keyword arguments')."""
    values = x.values() if isinstance(x, Mapping) else (x,)
    return frozenset(id(v) for v in values if isinstance(v, torch.Tensor))


def _output_parts(
    result: Any, batch: int, given: frozenset[int] = frozenset()
) -> tuple[tuple[int | str, tuple[int, ...] | None], ...]:
    """A tuple, list or dict output's tensors: each one's index or key and its shape per
    sample (None without a row per sample, or for an input handed back as it came: a
    sentence-transformers model returns its token ids beside its embeddings)."""
    named: list[tuple[int | str, Any]]
    if isinstance(result, Mapping):
        named = [(str(key), value) for key, value in result.items()]
    elif isinstance(result, tuple) and hasattr(result, "_fields"):
        # A named tuple: its fields by name, as output.select and also read them.
        named = list(zip(result._fields, result, strict=True))
    elif dataclasses.is_dataclass(result) and not isinstance(result, type):
        named = [(f.name, getattr(result, f.name)) for f in dataclasses.fields(result)]
    elif isinstance(result, list | tuple):
        named = list(enumerate(result))
    else:
        return ()
    return tuple(
        (
            key,
            tuple(value.shape[1:])
            if value.dim() and value.shape[0] == batch and id(value) not in given
            else None,
        )
        for key, value in named
        if isinstance(value, torch.Tensor)
    )


def _layer_features(
    shapes: tuple[tuple[int, ...], ...],
    tokens: bool,
    root: nn.Module,
    path: str,
    steps: str = "tokens",
) -> tuple[int, str]:
    if not shapes:
        return 0, ""
    shape = shapes[0]
    reading = feature_reading(root, path)
    channels = reading.by == "type" and not reading.units_last
    if tokens and len(shape) == 3 and not channels:
        # A hidden state [B, T, H] of a text model is averaged over its tokens (the mask's).
        return shape[2], f"{shape[2]} units (mean over the {steps})"
    return _read(shape, reading)


def _token_input_features(x: torch.Tensor, width: int) -> int:
    """What the hooks keep of an input read by its steps (:func:`token_summary`): token ids
    ``[B, T]`` their count; a series ``[B, T]`` its count, mean and spread; a padded series'
    steps ``[B, T, F]`` each feature's mean."""
    if x.dim() == 3:
        return min(int(x.shape[2]), width)
    return 3 if x.dim() == 2 and (x.is_floating_point() or x.is_complex()) else 1


def _input_features(x: torch.Tensor, width: int) -> int:
    per_sample = math.prod(x.shape[1:])
    # The input's map is flattened when it fits what the hook keeps of it: with the default
    # projection, the projection's input width (see feature_summary and build_widths).
    return per_sample if x.dim() > 2 and per_sample <= width else _features(tuple(x.shape))


def _projection_width() -> int:
    """The default config's ``drift.projection_width`` (what ``layers`` assumes)."""
    return MonitoringConfig.from_mapping({}).drift.projection_width


def filter_layers(
    rows: Sequence[LayerInfo],
    depth: int | None = None,
    match: str | None = None,
    type_name: str | None = None,
) -> list[LayerInfo]:
    out = []
    for row in rows:
        pseudo = row.name in (INPUT_LAYER, OUTPUT_LAYER)
        if depth is not None and not pseudo and row.depth > depth:
            continue
        if match is not None and not fnmatch.fnmatchcase(row.name, match):
            continue
        if type_name is not None and row.type != type_name:
            continue
        out.append(row)
    return out


#: The class names a TorchScript module shows in ``hookwatch layers``.
_SCRIPTED_TYPES = frozenset({"RecursiveScriptModule", "ScriptModule", "TopLevelTracedModule"})


def format_layers(rows: Sequence[LayerInfo], max_features: int) -> str:
    def fmt(row: LayerInfo) -> str:
        shapes = row.shapes
        if not shapes:
            # A TorchScript module takes no hooks, so the dry run could not see it run.
            if row.untensored:
                return "(no tensor)"
            return "(TorchScript)" if row.type in _SCRIPTED_TYPES else "(did not run)"
        text = ", ".join("x".join(map(str, s[1:])) or "scalar" for s in shapes)
        return text if len(text) <= 28 else text[:25] + "..."

    name_w = max([len(r.name) for r in rows] + [5])
    type_w = max([len(r.type) for r in rows] + [4])
    lines = [
        f"{'layer':<{name_w}}  {'type':<{type_w}}  {'output (per sample)':<28}  "
        f"{'params':>10}  {'features':>8}  drift"
    ]
    width = _projection_width()
    for r in rows:
        notes = [f"features: {r.reading}"] if r.reading else []
        if r.features > max_features and r.name != OUTPUT_LAYER:
            notes.append(
                (f"its first {width} " if r.features > width else "")
                + f"projected to at most {max_features - 1} components + residual (one per "
                f"{SAMPLES_PER_COMPONENT} reference samples, fitted on half of them)"
            )
        if r.calls > 1:
            notes.append(f"runs {r.calls}x per forward: the last call is watched")
        if r.type in _SCRIPTED_TYPES:
            notes.append("TorchScript: takes no hooks, not watchable")
        if r.partial:
            notes.append(f"{r.partial}: rows not one per sample, init leaves it out")
        if r.vocabulary:
            notes.append(f"ids into an embedding of {r.vocabulary} rows (init writes max)")
        if r.untensored:
            notes.append(f"{r.untensored}, no tensor: {NO_TENSOR_HINT}")
        note = "; ".join(notes)
        lines.append(
            f"{r.name:<{name_w}}  {r.type:<{type_w}}  {fmt(r):<28}  "
            f"{r.parameters:>10,}  {r.features:>8}  {note}".rstrip()
        )
    return "\n".join(lines)


def _sequence_blocks(ran: Sequence[LayerInfo]) -> list[str]:
    """Recurrent and attention blocks, outermost first: one inside another kept block (the
    attention of a transformer layer) is left to it. A block of a class named ``...Layer``
    or ``...Block`` holding an attention (a library's transformer layer: ``BertLayer``,
    ``ViTLayer``, ``GPT2Block``) is one, so its output is watched rather than its attention's."""
    attentions = [row.name for row in ran if row.type.endswith("Attention")]
    kept: list[str] = []
    for row in ran:
        block = (
            row.type in SEQUENCE_BLOCKS
            or row.type.endswith("Attention")
            or (
                row.type.endswith(("Layer", "Block"))
                and any(name.startswith(row.name + ".") for name in attentions)
            )
        )
        if block and not any(row.name.startswith(name + ".") for name in kept):
            kept.append(row.name)
    return kept


def _spread(candidates: Sequence[str], count: int) -> list[str]:
    if len(candidates) <= count:
        return list(candidates)
    if count <= 1:
        return list(candidates[-count:]) if count else []
    step = (len(candidates) - 1) / (count - 1)
    return [candidates[round(i * step)] for i in range(count)]


def choose_layers(rows: Sequence[LayerInfo], count: int = 4) -> list[str]:
    """A starting set of layers, in model order: the recurrent and attention blocks where the
    model has them (spread over its depth), then activation modules spread over the depth of
    the model up to ``count``, or else the model's top-level blocks (the output aside)."""
    last = _final_module(rows) if final_activation(rows) else None
    ran = [
        r
        for r in rows
        if r.shapes
        and not r.partial
        and r.name not in (INPUT_LAYER, OUTPUT_LAYER)
        # A final softmax or sigmoid is the output, watched as such.
        and r is not last
    ]
    sequence = _spread(_sequence_blocks(ran), count)
    candidates = [r.name for r in ran if r.type in ACTIVATIONS and r.name not in sequence]
    if not candidates and not sequence:
        candidates = [r.name for r in ran if r.depth == 1][:-1]
    chosen = set(sequence) | set(_spread(candidates, count - len(sequence)))
    return [r.name for r in ran if r.name in chosen]


#: Modules that may follow a classifier and keep its output per-class scores (a CTC head's
#: log-probabilities: their softmax is the probabilities).
_AFTER_CLASSIFIER = frozenset({"LogSoftmax", "Dropout", "Identity"})


def _ends_in_classifier(rows: Sequence[LayerInfo]) -> bool:
    """Whether the model's output is what a ``Linear`` gave (then only the modules of
    :data:`_AFTER_CLASSIFIER`)."""
    last = _final_module(rows, _AFTER_CLASSIFIER)
    return last is not None and last.type in ("Linear", "LazyLinear")


def _final_module(
    rows: Sequence[LayerInfo], skip: frozenset[str] = frozenset({"Dropout", "Identity"})
) -> LayerInfo | None:
    """The module that gave the model's output, as far as shapes tell: the last one, in
    model order, whose output has the output's shape, those of a type in ``skip`` passed
    over."""
    out = rows[-1].shapes[0] if rows and rows[-1].shapes else None
    for row in reversed(rows[1:-1]):
        if row.shapes and row.shapes[0] == out and row.type not in skip:
            return row
    return None


def final_activation(rows: Sequence[LayerInfo]) -> str | None:
    """``Softmax`` or ``Sigmoid`` when the model's output is what such a module gave: its
    output is then probabilities, not logits; else None."""
    last = _final_module(rows)
    return last.type if last is not None and last.type in ("Softmax", "Sigmoid") else None


def guess_head(rows: Sequence[LayerInfo]) -> str:
    """The ``output.head`` to propose: ``logits`` for ``[B, C]`` (C > 1), and for ``[B, T, C]``
    where a ``Linear`` over the C classes gives the output (token classification, CTC: read per
    position); ``values`` for ``[B]`` and ``[B, 1]``; else ``embedding``."""
    shapes = rows[-1].shapes
    if not shapes:
        return "none"
    if rows[-1].items:
        return "values"  # each entry's count and mean, one detector
    shape = shapes[0]
    if _reconstruction(rows):
        return "values"
    if final_activation(rows) == "Sigmoid" and len(shape) in (1, 2):
        # Independent probabilities, one a label; one a sample: a binary classifier's.
        return "multilabel" if len(shape) == 2 and shape[1] > 1 else "logits"
    if len(shape) == 2:
        if shape[1] > 1 and _final_type(rows) in _NOT_LOGITS:
            # Several values out of an activation (an embedding tower ending in Tanh):
            # logits come out of a linear layer, never through one of these.
            return "embedding"
        return "logits" if shape[1] > 1 else "values"
    if len(shape) == 3 and shape[2] > 1 and _ends_in_classifier(rows):
        return "logits"
    if _pixel_map(rows):
        return "logits"
    # [B]: one value per sample (a squeezed regression output, class ids): not logits.
    return "values" if len(shape) == 1 else "embedding"


def _reconstruction(rows: Sequence[LayerInfo]) -> bool:
    """An output ``[B, F]`` of the input's own shape, at least :data:`_RECONSTRUCTED` values
    (an autoencoder's, a denoiser's): values, not ``F`` classes (read as logits or, out of a
    Sigmoid, ``F`` labels, before)."""
    given = rows[0].shapes if rows else ()
    out = rows[-1].shapes if rows else ()
    return (
        len(given) == 1
        and len(out) == 1
        and len(out[0]) == 2
        and given[0][1:] == out[0][1:]
        and out[0][1] >= _RECONSTRUCTED
    )


#: Values a sample from which an output of the input's shape is read as its reconstruction.
_RECONSTRUCTED = 16


#: Activations a model's output never comes through when it is class scores.
_NOT_LOGITS = frozenset(
    {"Tanh", "Hardtanh", "ReLU", "ReLU6", "Softplus", "GELU", "SiLU", "ELU", "LeakyReLU"}
)


def _final_type(rows: Sequence[LayerInfo]) -> str | None:
    last = _final_module(rows)
    return last.type if last is not None else None


#: Activations a model's last module may be when it answers an image, not class scores.
_IMAGE_OUT = frozenset({"Sigmoid", "Tanh", "Hardtanh", "Hardsigmoid", "ReLU", "ReLU6", "Softplus"})


def _pixel_map(rows: Sequence[LayerInfo]) -> bool:
    """An output ``[B, C, H, W]`` of a few channels over the input image's own pixels: a
    segmentation net's class map (classes first, as its last convolution gives them)."""
    out = rows[-1].shapes[0] if rows and rows[-1].shapes else ()
    given = rows[0].shapes[0] if rows and rows[0].shapes else ()
    if not (len(out) == 4 and len(given) == 4 and out[2:] == given[2:] and 1 < out[1] <= 1000):
        return False
    # An image out (a denoiser's, an upscaler's, a colouriser's) ends in a bounded activation
    # more often than not; logits never do.
    last = _final_module(rows, frozenset())
    return last is None or last.type not in _IMAGE_OUT


def _variable_lines(spec: InputSpec, dtype: str) -> list[str]:
    """The input lines of a length each request chooses, as the config declared it."""
    at = spec.length_dim
    dims = ["null" if i == at else str(d) for i, d in enumerate(spec.shape or ())]
    lines = [
        f"    shape: [{', '.join(dims)}]   # null: any length up to max_length",
        f"    max_length: {(spec.shape or ())[at or 0]}",
        f"    dtype: {dtype}",
    ]
    for key in ("lengths", "mask"):
        name = getattr(spec, key)
        if name is not None:
            lines.append(f"    {key}: {_flow_scalar(name)}")
    if spec.pad_value:
        lines.append(f"    pad_value: {spec.pad_value:g}")
    for key, value in (("min", spec.min_value), ("max", spec.max_value)):
        if value is not None:
            lines.append(f"    {key}: {value:g}")
    return lines


def _vocabulary_lines(vocabulary: int) -> list[str]:
    """``min``/``max`` of an input that goes straight into an embedding of ``vocabulary``
    rows: ids past it would reach the forward and fail there (a 422 naming an IndexError),
    so they are refused up front, as the ids the model takes."""
    return [
        f"    min: 0             # the input goes straight into an embedding of {vocabulary} rows:",
        f"    max: {vocabulary - 1}{' ' * max(1, 14 - len(str(vocabulary - 1)))}"
        "# other ids get a 400 saying so",
    ]


#: TorchServe's keys `init` writes, and their values unless the config it starts from has its
#: own: one request a batch (a model whose answers do not depend on its batch is the user's
#: to batch), a 30 s answer.
SERVING_KEYS: Mapping[str, Any] = {"responseTimeout": 30, "batchSize": 1, "maxBatchDelay": 5}


def init_config(
    rows: Sequence[LayerInfo],
    shape: Sequence[int],
    dtype: str,
    argument: str | None,
    source: str,
    arguments: Sequence[InputSpec] = (),
    variable: InputSpec | None = None,
    served: Mapping[str, Any] | None = None,
    text: Mapping[str, Any] | None = None,
    labels: Sequence[str] | None = None,
    normalisation: Mapping[str, Any] | None = None,
) -> str:
    """A commented model-config.yaml to start from (``arguments``: the ``input.arguments`` of
    a several-tensor model's config, written back as they were declared; ``variable``: a
    config's input of a length each request chooses, its null and keys written back;
    ``served``: TorchServe's keys of that config, kept over :data:`SERVING_KEYS`; ``text``:
    a text model's ``input.text``, written back as it was declared; ``labels``: the class
    names the model carries, written as ``handler.labels`` where they name its classes;
    ``normalisation``: the ``mean``, ``std`` (and the file they came ``from``) an image model
    saves beside it, written as the input's, with image requests)."""
    served = {k: v for k, v in (served or {}).items() if k in SERVING_KEYS}
    rows, first_with_rows = _rows_first(rows)
    layers = choose_layers(rows)
    head = guess_head(rows)
    if text is not None:
        # JSON is YAML's flow style: each key's value reads back as it was given.
        input_lines = [
            "    text:   # texts tokenised by the tokenizer archived under this argument's name",
            *(f"      {key}: {json.dumps(value)}" for key, value in text.items()),
        ]
        if argument:
            input_lines.append(
                f"    argument: {_flow_scalar(argument)}   # the tokens together as one dict: "
                f"forward({argument})"
            )
    elif arguments:
        input_lines = _argument_lines(arguments)
        if argument:
            input_lines[0:1] = [
                f"    argument: {_flow_scalar(argument)}   # the arguments together as one dict: "
                f"forward({argument})",
                "    # one JSON field a tensor, each a key of that dict",
            ]
    elif variable is not None and variable.length_dim is not None:
        input_lines = _variable_lines(variable, dtype)
        vocabulary = rows[0].vocabulary if rows and rows[0].name == INPUT_LAYER else 0
        if vocabulary and variable.min_value is None and variable.max_value is None:
            input_lines += _vocabulary_lines(vocabulary)
    else:
        input_lines = [f"    shape: [{', '.join(map(str, shape))}]", f"    dtype: {dtype}"]
        if argument:
            input_lines.append(
                f"    argument: {_flow_scalar(argument)}   # forward(*, {argument}=...)"
            )
        channels = shape[0] if len(shape) == 3 else 0
        preprocessed = (
            normalisation is not None
            and len(normalisation["mean"]) == channels
            and dtype == "float32"
        )
        if preprocessed:
            assert normalisation is not None
            # The model's own preprocessing, saved beside it: requests are image files.
            input_lines += [
                f"    encoding: image   # as {Path(normalisation['from']).name} preprocesses: "
                "pixels / 255, then",
                f"    mean: {json.dumps(normalisation['mean'])}",
                f"    std: {json.dumps(normalisation['std'])}",
                "    # (resized with its aspect kept and centre-cropped, where the processor may "
                "stretch)",
                "    min: 0",
                "    max: 1",
            ]
        elif len(shape) == 3 and shape[0] in (1, 3, 4) and dtype in ("float32", "uint8"):
            # Looks like an image: clients may well have files, not arrays, to send.
            input_lines += [
                "    # encoding: image  # JPEG/PNG bodies (or base64 in the JSON field): decoded,",
                "    #                  # resized and centre-cropped to the shape, pixels / 255",
            ]
        vocabulary = rows[0].vocabulary if rows and rows[0].name == INPUT_LAYER else 0
        if len(shape) == 1 and not vocabulary and not preprocessed and 1 < shape[0] <= 64:
            # A table's row: its columns may be named, for records and CSV headers.
            input_lines.append(
                f"    # features: [{', '.join(f'col{i}' for i in range(min(shape[0], 3)))}"
                f"{', ...' if shape[0] > 3 else ''}]   # column names, in order: records "
                "and CSV headers read by name"
            )
        if preprocessed:
            pass
        elif vocabulary:
            input_lines += _vocabulary_lines(vocabulary)
        else:
            input_lines += [
                "    # min: 0           # requests outside [min, max] get a 400",
                "    # max: 1",
            ]
        if not preprocessed:
            input_lines += [
                "    # mean: [0.485, 0.456, 0.406]   # normalisation the model expects, per "
                "channel:",
                "    # std: [0.229, 0.224, 0.225]    # requests and reference data come "
                "un-normalised",
            ]
    heads = "logits (classes) | multilabel | values (regression) | embedding | none"
    out = rows[-1].shapes[0] if rows and rows[-1].shapes else ()
    sequence_note = (
        [
            f"    # The output is [batch, {', '.join(map(str, out[1:]))}]: per-position logits "
            "(CTC, token",
            "    # classification) take head logits: a class and its probability per position,",
            "    # class shares, mean confidence and entropy over the positions. As embedding,",
            "    # each value averaged over the positions is watched. A forecast (steps x",
            "    # quantiles) takes head values: answered nested, each quantile's mean watched.",
        ]
        if len(out) == 3
        else [
            f"    # The output is [batch, {', '.join(map(str, out[1:]))}] over the input's "
            "pixels: a class map",
            "    # (segmentation) takes head logits: a class and its probability per pixel, class",
            "    # shares, mean confidence and entropy over the pixels. As embedding, each",
            "    # channel averaged over the pixels is watched.",
        ]
        if _pixel_map(rows)
        else []
    )
    parts = rows[-1].shapes if rows else ()
    named = rows[-1].parts if rows else ()
    pooled = _pooled_part(named, out) if head == "embedding" else None
    # The head's part, where it is not the output's first (one without a row per sample, a
    # loss or a count, comes first).
    selected = pooled if pooled is not None else first_with_rows
    if pooled is not None:
        # A sample's own vector (a text encoder's pooled output) over every token's states.
        sequence_note = [
            f"    # The output's {_part_text(pooled)} is one vector a sample, the sequence's: "
            "answered and",
            f"    # watched as its embedding ({_part_text(named[0][0])} would answer every "
            "position's).",
        ]
    select_note = (
        [
            f"    # The output holds {len(named)} tensors ("
            + "; ".join(
                f"{key}: {'x'.join(map(str, shape or ())) or 'a value'}"
                if shape is not None
                else f"{key}: no row per sample"
                for key, shape in named
            )
            + f"): the head reads {_part_text(named[0][0])},",
            f"    # unless output.select names another (select: {_part_text(named[1][0])}); "
            "also: others answered beside it",
        ]
        if len(named) > 1
        else [
            f"    # The output holds {len(parts)} tensors ("
            + "; ".join("x".join(map(str, p[1:])) or "scalar" for p in parts)
            + "): the head reads the first,",
            "    # unless output.select names another (an index, or a dict's key): select: 1",
        ]
        if len(parts) > 1
        else []
    )
    # The other parts of a row per sample, small enough to answer: a multi-task model's heads.
    also = [
        key
        for key, shape in named[1:]
        if shape is not None and math.prod(shape) <= ALSO_LARGEST and str(key) not in ANSWER_KEYS
    ]
    also_text = ", ".join(map(_part_text, also))
    ending = final_activation(rows) if rows else None
    probabilities = ending is not None and head in ("logits", "multilabel")
    probabilities_note = (
        [
            f"    # The model ends in {ending}: its output is probabilities, read as such "
            "(probabilities: true),",
            "    # not passed through a softmax or sigmoid a second time.",
        ]
        if probabilities
        else []
    )
    items = rows[-1].items if rows else ()
    listed = bool(rows) and rows[-1].listed
    items_note = (
        [
            "    # The output is a list of one tensor a sample (rows of a varying count: a",
            f"    # detector's after NMS): each sample is answered its tensor as {LISTED_KEY};",
            "    # head values watches its row count and mean per sample as one drift detector.",
        ]
        if listed
        else [
            f"    # The output is one dict a sample ({', '.join(items)}: a detector's): each "
            "sample is",
            "    # answered as its dict; head values watches each entry's count and mean per",
            "    # sample (how many objects, how sure) as one drift detector.",
        ]
        if items
        else []
    )
    one_value_note = (
        [
            f"    # The output has the input's shape ({out[1]} values): read as its "
            "reconstruction (an",
            "    # autoencoder's), head values; if these are classes' scores, head logits.",
        ]
        if rows and _reconstruction(rows)
        else [
            "    # One value a sample: a regression output (values), or a binary classifier's",
            "    # logit (logits: class 1 where it is positive, with probability sigmoid(z)).",
        ]
        if (len(out) == 1 or (len(out) == 2 and out[1] == 1)) and not probabilities
        else [
            f"    # [batch, {out[1]}] read as {out[1]} classes' logits (softmax, class mix); "
            "several values a",
            "    # sample (a forecast, coordinates, scores) are head values; one logit a "
            "label, multilabel.",
        ]
        if len(out) == 2 and head == "logits" and not items and not probabilities
        else []
    )
    return "\n".join(
        [
            f"# Written by `hookwatch init` for {source}: a start, review every line.",
            "# TorchServe's own keys:",
            *(f"{key}: {json.dumps(value)}" for key, value in {**SERVING_KEYS, **served}.items()),
            "",
            "handler:",
            "  torch_threads: 1",
            *_labels_lines(labels, head, out),
            "  input:",
            *input_lines,
            "  monitoring:",
            "    # named_modules() paths, glob patterns (blocks.*.act) or, with layer_types,",
            "    # class names; see `hookwatch layers` for the candidates.",
            f"    layers: [{', '.join(map(_flow_scalar, layers))}]",
            *sequence_note,
            *([] if items or selected is not None else select_note),
            *items_note,
            *one_value_note,
            *probabilities_note,
            f"    output: {{head: {head}{', probabilities: true' if probabilities else ''}"
            f"{f', items: {LISTED_KEY}' if listed else ''}"
            f"{f', select: {_part_text(selected)}' if selected is not None else ''}"
            f"{f', also: [{also_text}]' if also and pooled is None else ''}}}"
            f"   # {heads}",
            "    # sample_rate unset: 10 % of requests, at most max_sampled_per_s (20) a second",
            "    # and their hooks at most max_overhead (0.005) of the worker's time",
            "    drift: {window: 200}",
            "",
        ]
    )


def _labels_lines(labels: Sequence[str] | None, head: str, out: Sequence[int | None]) -> list[str]:
    """``handler.labels`` from the names the model carries, where they are one per class of
    a logits output: ``[batch, classes]``, per position ``[batch, positions, classes]`` (a
    token classifier's), or a class map ``[batch, classes, H, W]`` (a segmentation net's)."""
    classes = out[2] if len(out) == 3 else out[1] if len(out) in (2, 4) else None
    if not labels or head not in ("logits", "multilabel") or classes != len(labels):
        return []
    return [
        "  # the model's own class names (its config's id2label): answers name the class",
        f"  labels: {json.dumps(list(labels), ensure_ascii=False)}",
    ]


def _rows_first(rows: Sequence[LayerInfo]) -> tuple[Sequence[LayerInfo], int | str | None]:
    """``rows`` with the output's first part that has a row per sample put first, and its
    key, where the output's first part has none (``(loss, logits)``); as they are, None,
    otherwise."""
    if not rows or len(rows[-1].parts) < 2 or rows[-1].parts[0][1] is not None:
        return rows, None
    last = rows[-1]
    at = next((i for i, (_, shape) in enumerate(last.parts) if shape is not None), None)
    if at is None or len(last.shapes) != len(last.parts):
        return rows, None
    order = [at, *(i for i in range(len(last.parts)) if i != at)]
    moved = dataclasses.replace(
        last,
        shapes=tuple(last.shapes[i] for i in order),
        parts=tuple(last.parts[i] for i in order),
    )
    return [*rows[:-1], moved], last.parts[at][0]


def _pooled_part(
    named: Sequence[tuple[int | str, tuple[int, ...] | None]], out: Sequence[int | None]
) -> int | str | None:
    """The part of a model's output that is one vector a sample (``pooler_output``
    ``[B, H]``) where its first part is a state per position (``last_hidden_state``
    ``[B, T, H]``); None where there is none."""
    if len(out) != 3 or len(named) < 2:
        return None
    return next(
        (
            key
            for key, shape in named[1:]
            if shape is not None and len(shape) == 1 and shape[0] == out[2]
        ),
        None,
    )


def _argument_lines(arguments: Sequence[InputSpec]) -> list[str]:
    """``input.arguments`` as declared: one flow mapping per keyword argument."""
    lines = ["    # one JSON field a tensor, each passed to forward() as the keyword it names"]
    lines.append("    arguments:")
    for part in arguments:
        at = part.length_dim
        shape = [None if i == at else d for i, d in enumerate(part.shape or ())]
        declared: dict[str, Any] = {"shape": shape, "dtype": part.dtype}
        if at is not None:
            # A length each request chooses: its bound and keywords as declared.
            declared["max_length"] = (part.shape or ())[at]
            declared |= {k: getattr(part, k) for k in ("lengths", "mask") if getattr(part, k)}
            if part.pad_value:
                declared["pad_value"] = part.pad_value
        for key, value in (("min", part.min_value), ("max", part.max_value)):
            if value is not None:
                # As the user wrote it: 49, not 49.0 (the config keeps bounds as floats).
                declared[key] = int(value) if value.is_integer() else value
        for key, values in (("mean", part.mean), ("std", part.std)):
            if values is not None:
                declared[key] = list(values)
        flow = yaml.safe_dump(declared, default_flow_style=True, sort_keys=False).strip()
        lines.append(f"      {_flow_scalar(part.field)}: {flow}")
    return lines


def _sums_to_one(output: torch.Tensor) -> bool:
    """Every row of several classes in [0, 1] and summing to 1: a softmax's output (classes
    last, or first in a class map ``[B, C, H, W]``)."""
    if output.dim() < 2 or not output.is_floating_point() or not output.numel():
        return False
    x = output.detach().float()
    x = x.movedim(1, -1) if x.dim() >= 4 else x
    if x.shape[-1] < 2 or bool((x < 0).any()) or bool((x > 1).any()):
        return False
    return bool(torch.allclose(x.sum(dim=-1), torch.ones(()), atol=1e-4))


def _check_class_names(labels: Sequence[str], logits: torch.Tensor, head: str) -> None:
    """``handler.labels`` name every class of the logits (every label of a ``multilabel``
    head), no more: an answer names them by index (a binary classifier's one logit has two
    classes)."""
    # Classes last ([B, C], [B, T, C]), or first in a class map [B, C, H, W].
    classes = (
        int(logits.shape[1] if logits.dim() >= 4 else logits.shape[-1]) if logits.dim() >= 2 else 1
    )
    if head == "multilabel":
        if len(labels) != classes:
            raise ConfigError(
                f"handler.labels: expected {classes} names (one per label, one per logit of "
                f"the model's output, in order), got {len(labels)}"
            )
        return
    classes = 2 if classes == 1 else classes
    if len(labels) != classes:
        raise ConfigError(
            f"handler.labels: expected {classes} names (one per class of the model's logits, "
            f"in class order), got {len(labels)}"
        )


def _row_per_sample(tensor: torch.Tensor, samples: int) -> bool:
    """A row per sample, batch-first or (a sequence-first ``[T, B, ...]``) second, as the
    service answers it."""
    return bool(tensor.dim()) and (
        tensor.shape[0] == samples or (tensor.dim() > 2 and tensor.shape[1] == samples)
    )


def _per_class(estimate: AccuracyEstimator) -> str:
    """The labelled reference's samples per class the estimate holds, in words."""
    classes = max(1, len(np.unique(estimate.labels)))
    return f"{len(estimate.labels) / classes:.1f} a class over {classes} classes"


def _part_text(part: int | str) -> str:
    """A part of the output as YAML reads it back: an index as a number, a key a string."""
    return str(part) if isinstance(part, int) else _flow_scalar(part)


def _flow_scalar(name: str) -> str:
    """``name`` as a YAML flow scalar that reads back as that string: an nn.Sequential's
    module paths are digits (``0``, ``2``), which YAML reads as numbers, and a glob pattern may
    start with ``*`` (an alias to YAML); those are quoted (a JSON string is YAML's
    double-quoted scalar)."""
    try:
        plain = yaml.safe_load(f"[{name}]") == [name]
    except yaml.YAMLError:
        plain = False
    return name if plain else json.dumps(name)


# -- reference data ----------------------------------------------------------------------------

#: A table is read as a reference where the input names its columns (``input.features``):
#: its header says which column is which. Otherwise their order is the user's to say, which an
#: array or request bodies do.
_CSV_HINT = (
    " (a table: name its columns in input.features to read it by its header, or "
    "numpy.save(path, table.to_numpy(dtype='float32')) writes its rows as an array in the "
    "input's order)"
)
#: What a table's file may be called.
TABLE_SUFFIXES = (".csv", ".tsv")


def _table_batches(path: Path, pipeline: InputPipeline, batch_size: int) -> Iterator[ModelInputs]:
    """A CSV reference's rows, read as a CSV request's are (its header by name), in batches."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"reference: expected a readable UTF-8 table, got {error}") from None
    try:
        values = pipeline.table(text)
    except BadInputError as error:
        raise ConfigError(f"reference: {path.name}: {error}") from None
    for start in range(0, len(values), batch_size):
        yield pipeline.batch(values[start : start + batch_size])


def load_reference(path: Path, pipeline: Pipeline, batch_size: int = 64) -> Iterator[ModelInputs]:
    """Reference inputs as serving would feed them to the model, in batches.

    ``.npy``/``.npz``/``.pt``: an array of raw inputs ``[N, *shape]`` (as requests send them; the
    pipeline applies dtype and normalisation). ``.jsonl``: one request body per line, decoded
    exactly as a request (a text model's reference: a JSON string per line). A directory:
    image files (``input.encoding: image``), each decoded as a request's body would be, in
    the order of :func:`image_files`.
    """
    if path.is_dir():
        yield from _image_batches(path, pipeline, batch_size)
        return
    if path.suffix == ".jsonl":
        items: list[Any] = []
        try:
            lines = path.read_text().splitlines()
        except OSError as error:
            raise ConfigError(f"reference: expected a readable file, got {error}") from None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                # As TorchServe hands over a body sent as application/json: parsed.
                items.append(pipeline.decode(json.loads(line)))
            except ValueError as error:
                raise ConfigError(
                    f"reference: line {number} of {path.name}: expected JSON, got {error}"
                ) from None
            except BadInputError as error:
                raise ConfigError(f"reference: line {number} of {path.name}: {error}") from None
        if not items:
            raise ConfigError(f"reference: expected request bodies in {path}, got none")
        for start in range(0, len(items), batch_size):
            yield batch_inputs(pipeline, items[start : start + batch_size])
        return
    if isinstance(pipeline, TextPipeline):
        raise ConfigError(
            f"reference: expected a .jsonl of texts (a JSON string per line) for a text model, "
            f"got {path.name}"
        )
    tabular = isinstance(pipeline, InputPipeline) and pipeline.spec.features is not None
    if path.suffix in TABLE_SUFFIXES and tabular:
        assert isinstance(pipeline, InputPipeline)
        yield from _table_batches(path, pipeline, batch_size)
        return
    if path.suffix not in ARRAY_SUFFIXES:
        raise ConfigError(
            f"reference: expected a .npy, .npz, .pt or .jsonl file, got {path.name}"
            f"{_CSV_HINT if path.suffix in (*TABLE_SUFFIXES, '.txt') else ''}"
        )
    loaded = read_arrays(path, "reference")
    if isinstance(pipeline, ArgumentsPipeline):
        yield from _argument_batches(path, loaded, pipeline, batch_size)
        return
    if isinstance(loaded, dict):
        # A `y` array beside the inputs holds the reference's labels (tools/labels.py).
        inputs = [name for name in loaded if name != LABELS_ARRAY]
        if not inputs:
            raise ConfigError(
                f"reference: expected an array of inputs in {path}, got arrays {list(loaded)}"
            )
        array = loaded[inputs[0]]
    else:
        array = loaded
    values = _reference_values(array, pipeline.spec, "handler.input")
    for start in range(0, len(values), batch_size):
        yield pipeline.batch(values[start : start + batch_size])


def _image_batches(directory: Path, pipeline: Pipeline, batch_size: int) -> Iterator[ModelInputs]:
    """A directory's files, each decoded as a request's body: image files for an image
    input, WAV recordings for a waveform's (``[samples]``, ``[channels, samples]``)."""
    image = isinstance(pipeline, InputPipeline) and pipeline.spec.encoding == "image"
    audio = (
        isinstance(pipeline, InputPipeline)
        and not image
        and pipeline.spec.preprocess is None
        and len(pipeline.spec.shape or ()) in (1, 2)
    )
    if not (image or audio):
        raise ConfigError(
            f"reference: expected a .npy, .npz, .pt or .jsonl file (a directory holds images, for "
            f"input.encoding: image, or WAV recordings, for a waveform), got the directory "
            f"{directory}"
        )
    assert isinstance(pipeline, InputPipeline)
    suffixes = IMAGE_SUFFIXES if image else AUDIO_SUFFIXES
    files = [file for file in image_files(directory) if file.suffix.lower() in suffixes]
    if not files:
        kind = "image files" if image else "WAV recordings"
        raise ConfigError(
            f"reference: expected {kind} ({', '.join(sorted(suffixes))}) in {directory}, got none"
        )
    for start in range(0, len(files), batch_size):
        items = []
        for file in files[start : start + batch_size]:
            try:
                items.append(pipeline.decode(file.read_bytes()))
            except BadInputError as error:
                raise ConfigError(f"reference: {file}: {error}") from None
            except OSError as error:
                raise ConfigError(f"reference: expected a readable file, got {error}") from None
        yield pipeline.batch(items)


def _argument_batches(
    path: Path, loaded: Any, pipeline: ArgumentsPipeline, batch_size: int
) -> Iterator[ModelInputs]:
    """Reference batches of a several-tensor input: an ``.npz`` with an array per argument,
    named as the argument, the same samples in the same order in each."""
    names = list(pipeline.parts)
    if not isinstance(loaded, dict):
        raise ConfigError(
            f"reference: expected an .npz (or a .pt of a dict of tensors) with an array per "
            f"argument of input.arguments ({', '.join(names)}), or request bodies in a .jsonl, "
            f"got one array in {path.name}"
        )
    missing = [name for name in names if name not in loaded]
    if missing:
        raise ConfigError(
            f"reference: expected arrays named {', '.join(names)} in {path.name} (one per "
            f"argument of input.arguments), got {list(loaded)}"
        )
    values = {
        name: _reference_values(loaded[name], part.spec, f"input.arguments.{name}", name)
        for name, part in pipeline.parts.items()
    }
    counts = {name: len(v) for name, v in values.items()}
    if len(set(counts.values())) > 1:
        raise ConfigError(
            "reference: expected as many samples in every argument's array, got "
            + ", ".join(f"{name} {count}" for name, count in counts.items())
        )
    for start in range(0, len(values[names[0]]), batch_size):
        yield pipeline.columns({name: v[start : start + batch_size] for name, v in values.items()})


def _reference_values(
    array: NDArray[Any], spec: InputSpec, where: str, name: str = ""
) -> torch.Tensor | _Float32Rows:
    """One input's reference array ``[N, *shape]`` as serving decodes a request's numbers:
    its shape, finiteness, dtype and range checked (``name``: the argument's array)."""
    what = f"reference{f' {name}' if name else ''}"
    if spec.shape is not None and not fits_shape(array.shape[1:], spec):
        # A variable length: an array holds samples of one length; request bodies of any.
        any_length = (
            ", every sample as long (a .jsonl of request bodies holds samples of any length)"
            if spec.length_dim is not None
            else ""
        )
        raise ConfigError(
            f"{what}: expected an array of shape [N, {spec.shape_text.strip('[]')}] "
            f"({where}.shape{any_length}), got {list(array.shape)}"
        )
    if len(array) < 2:
        raise ConfigError(f"{what}: expected at least 2 samples, got {len(array)}")
    if not np.issubdtype(array.dtype, np.number) and array.dtype != np.bool_:
        raise ConfigError(f"{what}: expected numbers, got dtype {array.dtype}")
    if np.issubdtype(array.dtype, np.inexact):
        # Before any cast: an integer input's would hide a NaN from the builder's own check.
        # A slice at a time: the array may be mapped from a file larger than memory.
        bad, first = 0, -1
        for start in range(0, len(array), _CHECKED_ROWS):
            chunk = np.asarray(array[start : start + _CHECKED_ROWS])
            rows = ~np.isfinite(chunk.reshape(len(chunk), -1)).all(axis=1)
            if rows.any():
                first = first if bad else start + int(rows.argmax())
                bad += int(rows.sum())
        if bad:
            raise ConfigError(
                f"reference: expected finite values, got NaN or Infinity in {bad} of "
                f"{len(array)} samples (the first: sample {first}){f' of {name}' if name else ''}"
            )
    values: torch.Tensor | _Float32Rows
    if spec.dtype != "float32" and spec.mean is None and spec.std is None:
        # As a request's numbers are decoded: exact integers (no float32 on the way), and a
        # value the input's dtype cannot hold refused.
        try:
            values = decode_as(array, spec.dtype)
        except BadInputError as error:
            raise ConfigError(f"{what}: {error}") from None
    else:
        values = _Float32Rows(array)
    lo, hi = spec.min_value, spec.max_value
    if lo is not None or hi is not None:
        low, high = float(values.min()), float(values.max())
        if (lo is not None and low < lo) or (hi is not None and high > hi):
            raise ConfigError(
                f"{what}: expected values in [{-math.inf if lo is None else lo:g}, "
                f"{math.inf if hi is None else hi:g}] ({where}), got [{low:g}, {high:g}]: pass "
                "raw inputs, as requests send them"
            )
    return values


#: Samples a reference's finiteness is checked over at a time.
_CHECKED_ROWS = 4096


class _Float32Rows:
    """A reference array read as float32 a batch at a time: the whole of a large uint8 image
    array as float32 would take four times its size at once (an ``.npy`` is mapped, not
    read, so only the batches in use are in memory)."""

    def __init__(self, array: NDArray[Any]) -> None:
        self._array = array

    def __len__(self) -> int:
        return len(self._array)

    def __getitem__(self, rows: slice) -> torch.Tensor:
        return torch.from_numpy(np.array(self._array[rows], dtype=np.float32))

    def min(self) -> float:
        return float(np.float32(self._array.min()))

    def max(self) -> float:
        return float(np.float32(self._array.max()))


# -- archive -----------------------------------------------------------------------------------


def _archiver() -> str:
    found = shutil.which("torch-model-archiver", path=str(Path(sys.executable).parent))
    found = found or shutil.which("torch-model-archiver")
    if found is None:
        raise ConfigError(
            "expected torch-model-archiver (pip install 'hookwatch[torchserve]'), found none"
        )
    return found


def archive_model(
    ref: ModelRef,
    name: str,
    config_path: Path,
    reference: Path,
    out: Path,
    build: Path,
    args: Mapping[str, Any] | None = None,
    weights: Path | None = None,
    extra_files: Sequence[Path] = (),
    say: Any = print,
    labels: Path | None = None,
) -> Path:
    """Build the model, profile the reference through the serving path, write ``name.mar``.

    ``labels`` (``--reference-labels``), or a ``y`` array in the reference ``.npz`` or a
    ``label`` field in its ``.jsonl``: the reference's classes, for the accuracy estimate.
    """
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise ConfigError(f"--name: expected letters, digits, '-', '_' or '.', got {name!r}")
    # Read first: a bad labels file fails before the model is built.
    model_config: ModelConfig = read_model_config(config_path)
    handler: HandlerConfig = model_config.handler
    labelled = reference_labels(labels, reference, handler.labels)
    model, spec = load_user_model(ref, args, weights)
    if not ref.scripted and not ref.module:
        undeclared = undeclared_imports(Path(spec.file), extra_files)
        if undeclared:
            # It imports here from the model's directory; a worker has only the archive.
            names = ",".join(str(p) for p in undeclared)
            raise ConfigError(
                f"--extra-files: expected every file {Path(spec.file).name} imports from its "
                f"directory, got none for {', '.join(p.name for p in undeclared)} (a worker "
                f"would fail to import it); add --extra-files {names}"
            )
    plan = plan_watch(model, handler.monitoring, name)
    config = plan.config
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    # Arguments naming a directory (a HuggingFace save_pretrained directory) travel with the
    # model: staged here under the argument's name, they land in the model directory.
    staged = build / "directories"
    directories = tuple(
        key
        for key, value in (args or {}).items()
        if isinstance(value, str) and Path(value).is_dir()
    )
    for key in directories:
        shutil.copytree(Path(str((args or {})[key])), staged / key)
    # Arguments naming a file travel too, each in a directory of its argument's name (two
    # arguments may name files of one name), its own name kept.
    named_files = {
        key: Path(value).name
        for key, value in (args or {}).items()
        if isinstance(value, str) and key not in directories and Path(value).is_file()
    }
    for key, file_name in named_files.items():
        (staged / key).mkdir(parents=True)
        shutil.copy(Path(str((args or {})[key])), staged / key / file_name)
    if named_files:
        say(
            "  files the model's arguments name travel in the archive: "
            + ", ".join(f"{key} ({name})" for key, name in named_files.items())
        )
    if handler.input.text is not None:
        if handler.input.text.tokenizer not in directories:
            raise ConfigError(
                f"input.text.tokenizer: expected a directory argument of the model (--model-args "
                f"naming a directory, archived under its name), got "
                f"{handler.input.text.tokenizer!r} (directory arguments: "
                f"{', '.join(directories) or 'none'})"
            )
        pipeline = make_pipeline(handler.input, staged)
    else:
        pipeline = make_pipeline(handler.input, build_dir_for_preprocess(extra_files, ref))
    # A length each request chooses, served one request a batch: nothing is ever padded, so
    # neither is the reference (a model that reads padding is then served as it is).
    alone = handler.input.variable is not None and model_config.raw.get("batchSize", 1) == 1
    batches = list(load_reference(reference, pipeline, batch_size=1 if alone else 64))
    # A dry run on the first reference batch: a shape the model refuses fails here, in one line.
    first = _first_rows(batches[0], 2)
    try:
        with torch.inference_mode():
            output = call_model(pipeline, model, first)
    except Exception as error:
        raise ConfigError(
            f"dry run: expected the model to accept inputs of {_describe_inputs(first)} "
            f"(handler.input), got {type(error).__name__}: {error_line(error)}"
            + integer_hint(error, first, "input.dtype: int64 in the model-config")
            + dtype_hint(error, model, first, "input.dtype: {} in the model-config")
            + arguments_hint(error, model)
        ) from None
    leading = _first_tensor(first)
    samples = int(leading.shape[0]) if leading is not None and leading.dim() else 0
    if config.output.items is not None:
        # as_items gives back what is not a list of tensors as it came.
        items = as_items(output, config.output.items)
        if items is output or len(items) != samples:
            raise ConfigError(
                f"monitoring.output.items: expected the output to be a list of one tensor a "
                f"sample ({samples} tensors for the dry run's {samples} samples), got "
                + (
                    f"{len(output)} items"
                    if isinstance(output, list | tuple)
                    else type(output).__name__
                )
            )
        output = items
    selected = select_tensor(output, config.output.select)
    if selected is None and _no_tensor(output):
        raise ConfigError(
            f"model output: expected a tensor, got {_no_tensor(output)}: {NO_TENSOR_HINT}"
        )
    if selected is None:
        raise ConfigError(
            f"monitoring.output.select: expected it to pick a tensor of the output, got "
            f"{type(output).__name__} with select={config.output.select!r}"
            f"{_select_choices(output)}"
        )
    if not per_sample_items(output) and not _row_per_sample(selected, samples):
        # Answers go out a row per request: rows that are not the samples' would answer
        # each request with another's, silently.
        raise ConfigError(
            f"model output: expected a row per sample, got shape {list(selected.shape)} for a "
            f"dry run of {samples} samples (the tensor output.select picks is answered, row i "
            "to request i): reshape a flattened [batch x positions, ...] to [batch, positions, "
            "...] in the model, declare a list of one tensor a sample (a detector's rows "
            "after NMS) as monitoring.output.items: detections (with head values), or select "
            "another part of the output"
        )
    for part in config.output.also:
        answered = select_tensor(output, part)
        if answered is None or not _row_per_sample(answered, samples):
            got = "none" if answered is None else f"shape {list(answered.shape)}"
            raise ConfigError(
                f"monitoring.output.also: expected {part!r} to pick a tensor of the output with "
                f"a row per sample ({samples} for the dry run), got {got}"
                f"{_select_choices(output) if answered is None else ''}"
            )
    if (
        config.output.head == "logits"
        and not config.output.probabilities
        and not per_sample_items(output)
        and _sums_to_one(selected)
    ):
        raise ConfigError(
            "monitoring.output: expected logits under head logits, got probabilities (each "
            "row of the output is in [0, 1] and sums to 1: the model ends in a softmax); set "
            "probabilities: true under monitoring.output, or a softmax of them answers and is "
            "watched"
        )
    if per_sample_items(output) and config.output.head in ("logits", "multilabel"):
        raise ConfigError(
            f"monitoring.output.head: expected values (or none) for an output of one dict a "
            f"sample ({', '.join(map(str, output[0]))}: a detector's, answered as each "
            f"sample's dict), got {config.output.head}: no tensor of it holds a sample's "
            "class scores"
        )
    if handler.labels is not None and config.output.head in ("logits", "multilabel"):
        _check_class_names(handler.labels, selected, config.output.head)
    from hookwatch._profile.builder import PADDING_READ, STEPS_WIDE, profile_for

    # What a padded batch's answers are cut at, found where samples are at hand; the profile
    # reads the output's steps as serving will (a fixed 8 steps never over a request's 4).
    steps_found = answer_steps(pipeline, model, batches[0], config.output)
    if steps_found is not None and config.output.steps is None:
        output_found = dataclasses.replace(config.output, steps="head" in steps_found)
        monitoring = dataclasses.replace(handler.monitoring, output=output_found)
        plan = plan_watch(model, monitoring, name)
        config = plan.config
    profile = profile_for(model, plan, forward_batches(batches, handler.input.argument))
    if (
        profile.left_out.get(OUTPUT_LAYER) == STEPS_WIDE
        and model_config.raw.get("batchSize", 1) != 1
    ):
        raise ConfigError(
            "model output: expected a row of a fixed width per sample, or a value a step "
            "as [batch, steps, 1], got [batch, steps] with as many steps as the batch's "
            "longest sample (batched beside a longer request, a request would be answered "
            "the padding's steps too); return the output as [batch, steps, 1] (answered cut "
            "at each request's length), or serve one request a batch (batchSize: 1 in the "
            "model-config)"
        )
    if profile.left_out.get(OUTPUT_LAYER) == PADDING_READ:
        variable = handler.input.variable
        keys = (
            "input"
            if variable is handler.input or variable is None
            else f"input.arguments.{variable.field}"
        )
        raise ConfigError(
            "model output: expected a sample's answer not to depend on the padding of its "
            "batch, got another answer for a sample padded beside a longer one (the model "
            "reads the padding: a request's answer would depend on the requests batched with "
            f"it); give forward each sample's length ({keys}.lengths) or a mask "
            f"({keys}.mask) and leave the padding out of what it computes, or serve one "
            "request a batch (batchSize: 1 in the model-config)"
        )
    #: Why labels the reference carries were left unused, said once (None: used, or none).
    unused: str | None = None
    if labelled is not None and not config.harm.enabled:
        # monitoring.harm.enabled: false: no accuracy estimate, even labelled (given with
        # --reference-labels too: nothing of the model needs them then).
        unused = "monitoring.harm.enabled is false (no accuracy estimate)"
    elif labelled is not None and labels is None and config.output.head != "logits":
        unused = f"labels are for logits heads, this one is {config.output.head}"
    elif (
        labelled is not None
        and labels is None
        and not per_sample_items(output)
        and selected.dim() >= 3
    ):
        # Labels the reference carries (class folders, a `y` array) are a sample's class;
        # per-position logits (a tagger's, a segmentation's class map) have no such class.
        unused = (
            "the accuracy estimate takes a class a sample, this model's logits are per "
            f"position (shape {list(selected.shape)})"
        )
    if labelled is not None and unused is not None:
        say(f"  {labelled[1]} left unused: {unused}; it pages on drift (HookwatchDrift)")
        labelled = None
    if labelled is not None:
        from hookwatch._profile.accuracy import with_accuracy

        y, where = labelled
        check_labels(y, where, profile.n_seen, config.output.head)
        profile = with_accuracy(
            profile, model, config, forward_batches(batches, handler.input.argument), y
        )
    profile_path = profile.save(build / config.drift.profile)
    files = [profile_path]
    rebuilt_note = ""
    if directories or named_files:
        # torch-model-archiver copies a directory's contents into the model directory.
        files.append(staged)
    if spec.kind in ("torchscript", "exported"):
        serialized = Path(spec.file)
        archived = ModelSpec(spec.kind, serialized.name, directories=directories)
    else:
        source = Path(spec.file)
        package = package_root(source)
        if ref.module:
            # Installed in the serving image as here: imported there by name.
            inside = ""
            say(
                f"  model module {ref.module}: a worker imports it by name from its own "
                f"environment (install {_distribution(ref.module)} in the serving image)"
            )
        elif package is None:
            shutil.copy(source, build / source.name)
            files.append(build / source.name)
            inside = source.name
        else:
            # A file of a package (its relative imports): the package travels whole, staged
            # as --extra-files packages are, and the worker imports the file by its dotted
            # name from the model directory.
            staged_package = build / "packages" / package.name
            # Hidden entries (.git, .venv, tool caches) are no part of what it imports.
            shutil.copytree(
                package, staged_package, ignore=shutil.ignore_patterns("__pycache__", ".*")
            )
            inside = source.resolve().relative_to(package.parent).as_posix()
            size = sum(f.stat().st_size for f in staged_package.rglob("*") if f.is_file())
            say(
                f"  model package {package.name} ({size / 2**20:.1f} MiB) archived whole: "
                f"{inside} imports from it"
                + (
                    " (large: data or checkpoints inside it travel too; move them out of the "
                    "package)"
                    if size > _LARGE_PACKAGE
                    else ""
                )
            )
        kept = {k: v for k, v in spec.args.items() if k not in directories and k not in named_files}
        found = installed_distribution(ref.module) if ref.module else None
        archived = ModelSpec(
            spec.kind,
            inside,
            spec.name,
            kept,
            None,
            directories,
            ref.module or None,
            named_files,
            "==".join(found) if found else None,
        )
        if (directories or named_files) and _rebuilds_same_weights(
            model, archived, build, staged, extra_files
        ):
            # The archived directories hold the weights already (a pretrained model's files):
            # a second copy would double the archive. Checked, not assumed: a layer the
            # constructor initialises at random keeps weights.pt in the archive.
            serialized = build / MODEL_SPEC_FILE
        else:
            serialized = build / "weights.pt"
            # The weights as built and profiled, whatever form they came in.
            torch.save(model.state_dict(), serialized)
            if _loads_as_tensors(serialized, model):
                archived = dataclasses.replace(archived, weights=serialized.name)
            else:
                # Packed parameters (quantize_dynamic's int8 Linear and LSTM keep theirs as
                # TorchScript objects) are pickled code to a worker's loader, which takes
                # tensors only: the model must come from its factory alone, exactly.
                serialized.unlink()
                kinds = _untensored(model)
                if not _rebuilds_same_outputs(
                    model, archived, build, staged, extra_files, pipeline, first
                ):
                    raise ConfigError(
                        "weights: expected a state_dict of tensors (what a worker loads "
                        f"safely), or a model that {spec.name or 'its class'}() builds the same "
                        f"each time; got a state_dict holding {kinds} (packed parameters, "
                        "as quantize_dynamic leaves) from a build whose outputs differ from "
                        "one build to the next (seed it, or load float weights shipped "
                        "with --extra-files before quantizing)"
                    )
                serialized = build / MODEL_SPEC_FILE
                rebuilt_note = (
                    f"  weights: none archived: the state_dict holds {kinds}, which a worker "
                    "does not load; a rebuild gave the same outputs, so workers build it"
                )
    archived = dataclasses.replace(archived, answer_steps=steps_found)
    (build / MODEL_SPEC_FILE).write_text(archived.to_json())
    if serialized != build / MODEL_SPEC_FILE:  # else the archiver's one serialized file
        files.append(build / MODEL_SPEC_FILE)
    handler_file = build / "hookwatch_handler.py"
    handler_file.write_text(HANDLER_SOURCE)
    packages = build / "packages"
    for extra in extra_files:
        if extra.is_dir():
            # A package the model imports: the archiver copies a directory's contents into
            # the model directory, so it is staged inside one of its own, under its name
            # (over the model's own package when that is named too).
            shutil.copytree(
                extra,
                packages / extra.name,
                ignore=shutil.ignore_patterns("__pycache__"),
                dirs_exist_ok=True,
            )
            continue
        if not extra.is_file():
            raise ConfigError(
                f"--extra-files: expected a file or a package directory at {extra}, got no "
                "such file"
            )
        files.append(extra)
    if packages.is_dir():
        files.append(packages)
    out.mkdir(parents=True, exist_ok=True)
    command = [
        _archiver(),
        "--model-name",
        name,
        "--version",
        "1.0",
        "--serialized-file",
        str(serialized),
        "--handler",
        str(handler_file),
        "--config-file",
        str(config_path),
        "--extra-files",
        ",".join(str(f) for f in files),
        "--export-path",
        str(out),
        "--force",
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise HookwatchError(
            f"torch-model-archiver failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}"
        )
    mar = out / f"{name}.mar"
    detectors = ", ".join(profile.references)
    say(
        f"wrote {mar} ({mar.stat().st_size / 2**20:.1f} MiB): model {spec.kind} "
        f"{spec.name or Path(spec.file).name}, layers {', '.join(config.watched)}, "
        f"output head {config.output.head}"
    )
    say(
        f"  drift profile from {profile.n_seen} reference samples: {len(profile.references)} "
        f"detectors ({detectors})"
    )
    if rebuilt_note:
        say(rebuilt_note)
    for detector, reason in profile.left_out.items():
        say(f"  left out: detector {detector}: {reason} (it can never alarm)")
    if profile.accuracy is not None and labelled is not None:
        estimate = profile.accuracy
        say(
            f"  accuracy estimate from {labelled[1]}: layer {profile.accuracy_layer}, "
            f"reference accuracy {estimate.reference_accuracy:.1%}; it pages on harm "
            "(HookwatchAccuracyDrop), drift warns"
        )
        if abs(estimate.reference_score - estimate.reference_accuracy) > MAX_ESTIMATE_GAP:
            # Pages compare the estimate with its own on the reference, so they hold; what the
            # dashboards show as accuracy does not read as the model's.
            say(
                f"  warning: the estimate on the reference itself is "
                f"{estimate.reference_score:.1%}, far from the {estimate.reference_accuracy:.1%} "
                f"measured: the neighbours in {profile.accuracy_layer!r} agree with the model at "
                f"another rate than it is right (a layer that sees little of what the answer "
                f"depends on, or few labelled samples a class: {_per_class(estimate)}); harm "
                "pages compare the estimate with that figure, but read it as a signal, not as "
                "the accuracy; more labelled samples or another monitoring.harm.layer bring "
                "it nearer"
            )
    elif unused is not None:
        pass  # said where the labels were left unused
    elif config.output.head != "logits":
        say(
            f"  output head {config.output.head}: no accuracy estimate (logits heads only); "
            "it pages on drift (HookwatchDrift)"
        )
    elif not config.harm.enabled:
        say("  monitoring.harm.enabled is false: no accuracy estimate; it pages on drift")
    else:
        say(
            "  no reference labels: no accuracy estimate; it pages on drift (HookwatchDrift). "
            "Pass --reference-labels for pages on harm"
        )
        folders = class_folders(reference) if reference.is_dir() else []
        if folders:
            say(
                f"  the reference's images are in folders ({', '.join(folders[:5])}"
                f"{', ...' if len(folders) > 5 else ''}): name the model's classes in "
                "handler.labels, in its class order, and folders named so label their images"
            )
    return mar


def _rebuilt(spec: ModelSpec, build: Path, staged: Path, extra_files: Sequence[Path]) -> nn.Module:
    """``spec`` built without a weights file from the files a worker gets (the model file, its
    directory arguments, the extra files), in a directory of their own, as a worker builds it."""
    with tempfile.TemporaryDirectory(dir=build) as tmp:
        directory = Path(tmp)
        if spec.module:
            pass  # imported by name
        elif "/" in spec.file:
            # The model's package, staged whole (archive_model).
            shutil.copytree(build / "packages", directory, dirs_exist_ok=True)
        else:
            shutil.copy(build / spec.file, directory / spec.file)
        for name in (*spec.directories, *spec.files):
            (directory / name).symlink_to((staged / name).resolve())
        for extra in extra_files:
            if extra.is_dir():
                shutil.copytree(extra, directory / extra.name, dirs_exist_ok=True)
            else:
                shutil.copy(extra, directory / extra.name)
        return build_model(spec, directory)


def _rebuilds_same_weights(
    model: nn.Module, spec: ModelSpec, build: Path, staged: Path, extra_files: Sequence[Path]
) -> bool:
    """Whether building ``spec`` (no weights file) as a worker would gives exactly the
    parameters and buffers of ``model``."""
    ours, theirs = model.state_dict(), _rebuilt(spec, build, staged, extra_files).state_dict()
    return ours.keys() == theirs.keys() and all(
        torch.equal(value, theirs[key]) for key, value in ours.items()
    )


def _loads_as_tensors(path: Path, model: nn.Module) -> bool:
    """Whether ``path`` (``model``'s saved state_dict) loads as a worker loads weights: with
    ``weights_only``, every entry a tensor."""
    from hookwatch._model import load_state, named_by_state

    try:
        state = load_state(path)
    except ConfigError:
        return False
    # load_state drops torch.compile's and DataParallel's prefixes: the names it gives are
    # those of the module inside the wrappers.
    return state.keys() == named_by_state(model).state_dict().keys()


def _untensored(model: nn.Module) -> str:
    """The kinds of ``model``'s state_dict entries that are not tensors, for a message."""
    kinds = sorted(
        {type(v).__name__ for v in model.state_dict().values() if not isinstance(v, torch.Tensor)}
    )
    return ", ".join(kinds) or "no tensors"


def _rebuilds_same_outputs(
    model: nn.Module,
    spec: ModelSpec,
    build: Path,
    staged: Path,
    extra_files: Sequence[Path],
    pipeline: Pipeline,
    inputs: ModelInputs,
) -> bool:
    """Whether building ``spec`` without weights, from the files a worker has, answers
    ``inputs`` exactly as ``model`` does (a factory that seeds its initialisation, or loads
    its own weights from a file that travels with it)."""
    try:
        rebuilt = _rebuilt(spec, build, staged, extra_files)
    except Exception as error:
        # As a worker would fail: it has these files and no others.
        raise ConfigError(
            f"weights: expected {spec.name or spec.file} to build again from the files a "
            f"worker gets (its state_dict holds packed parameters, so workers build it), "
            f"got {type(error).__name__}: {error_line(error)} (a file it reads travels "
            "with --extra-files)"
        ) from None
    with torch.inference_mode():
        ours = call_model(pipeline, model, inputs)
        theirs = call_model(pipeline, rebuilt, inputs)
    return _same(ours, theirs)


def _same(a: Any, b: Any) -> bool:
    """Exact equality of two outputs: tensors, and tuples, lists and dicts of them."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def build_dir_for_preprocess(extra_files: Sequence[Path], ref: ModelRef) -> Path:
    """Where a preprocess module is looked up at archive time: beside the extra files (which is
    where it lies in the model directory once archived), else beside the model file."""
    return (extra_files[0] if extra_files else ref.path).resolve().parent
