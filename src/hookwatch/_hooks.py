"""Forward hooks on the watched layers, registered around sampled forwards and gated.

A hook does three things on the request path: read the gate, take an owned copy of a small
activation or run the cheap reduction of a large one, and hand the result to a sink that never
blocks. It never raises into the model's forward and never stores the activation; a fault
disables that one layer and is reported through the sink's ``on_fault``.

By default the hooks are on the modules only while a sampled forward runs (:meth:`HookSet.arm`
before it, :meth:`HookSet.disarm` after it): an unsampled forward finds no hook on any module
and takes PyTorch's hook-free call path, as if the model were not watched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import enum
import fnmatch
import inspect
import logging
import math
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import FunctionType, TracebackType
from typing import Any, Final, NamedTuple, Protocol, TypeAlias

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.rnn import PackedSequence, pad_packed_sequence
from torch.utils.hooks import RemovableHandle

from hookwatch._config import GLOB_CHARS, MonitoringConfig, as_monitoring_config
from hookwatch._errors import ConfigError
from hookwatch._names import ALL_LAYERS, INPUT_LAYER, OUTPUT_LAYER
from hookwatch._padding import Padded
from hookwatch._stats import (
    feature_summary,
    position_summary,
    reduce_activation,
    token_summary,
)

log = logging.getLogger("hookwatch")

#: What a capture holds: a numpy array (host) or a tensor (device).
Held: TypeAlias = np.ndarray[Any, Any] | torch.Tensor

#: Host dtypes handed off as numpy arrays; others (bfloat16, complex) stay tensors.
_NUMPY_DTYPES = frozenset(
    {
        torch.float32,
        torch.float64,
        torch.float16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    }
)


def hold(tensor: torch.Tensor, owned: bool = False, host: bool = True) -> Held:
    """What a capture keeps of ``tensor``: its own copy, never the activation's storage.

    On the host, a numpy array: a record waits in the capture buffer for up to a drain
    (tens of milliseconds), and while it waits, every tensor in it is an object the garbage
    collector tracks. At 100 % sampling those survivors were promoted to the oldest generation
    and set off a full collection about every 6,000 sampled requests, 80-90 ms each in a worker
    with torch loaded (~14 µs a request on average, on whichever thread allocated last). A
    tuple holding only strings and numpy arrays is untracked at its first young collection and
    is never promoted. ``tensor.numpy().copy()`` is also cheaper than ``clone()`` at these sizes.

    On a device, the tensor itself (``owned``: it already has storage of its own), or a clone:
    moving it to the host here would synchronise the request's stream. So too without
    ``host`` (a model with compiled parts: their hooks run in the traced graph, and the trace
    must not meet numpy arrays in the record the hooks share) and inside any traced graph.
    """
    if (
        host
        and tensor.is_cpu
        and tensor.dtype in _NUMPY_DTYPES
        and type(tensor) is torch.Tensor
        and not torch.compiler.is_compiling()
    ):
        try:
            return (tensor.detach() if tensor.requires_grad else tensor).numpy().copy()
        except (RuntimeError, TypeError):
            pass  # a view numpy cannot take (a negative or conjugate bit): a tensor copy
    if owned:
        return tensor
    return (tensor.detach() if tensor.requires_grad else tensor).clone()


def as_array(value: Held) -> np.ndarray[Any, Any]:
    """A held capture field on the host (the capture thread's side of :func:`hold`)."""
    if isinstance(value, np.ndarray):
        return value
    return value.cpu().numpy()


class HookState(enum.Enum):
    DETACHED = "detached"
    ATTACHED = "attached"
    #: Attached but switched off after a fault; stays so until detached.
    FAULTED = "faulted"


class Capture(NamedTuple):
    """What a hook hands off: never the activation itself.

    Either the reductions (``stats``, ``features``), or, for a small activation, an owned copy
    (``raw``) that the capture thread reduces together with others: one copy is cheaper on the
    request path than a dozen small reductions, and reducing many samples at once amortises
    torch's per-operation cost. A named tuple, not a frozen dataclass: built on every sampled
    hook call, it costs a tenth as much. Each field is held by :func:`hold`: numpy arrays on
    the host, tensors on a device.
    """

    layer: str
    stats: Held | None
    features: Held | None
    raw: Held | None = None


#: A :class:`Capture` as a plain tuple, field for field: what a record holds (see
#: ``hookwatch._monitor.gate.Record``).
PlainCapture: TypeAlias = tuple[str, Held | None, Held | None, Held | None]


#: Read by every hook call: a module global, where the enum's attribute lookup costs ten times
#: as much.
_ATTACHED: Final = HookState.ATTACHED

#: ``torch.compiler.is_compiling()`` reads this module attribute (torch 2.3 and later); the
#: fast capture reads it directly, a call fewer per hook. Without it (older torch) a capture
#: always takes the general path.
_COMPILER: Final[Any] = torch.compiler
_FAST_CAPTURE: Final = isinstance(getattr(_COMPILER, "_is_compiling_flag", None), bool)


class CaptureSink(Protocol):
    def offer(self, capture: Capture) -> bool:
        """Take ``capture`` without blocking; return False if it was dropped."""

    def on_fault(self, layer: str, error: BaseException) -> None:
        """Called once when a layer's hook fails and is switched off."""


class StepsOf(NamedTuple):
    """Of a forward of several keyword arguments (``input.arguments``) one of which is padded
    to the batch's longest: that argument, the keywords beside them that are no input (its
    lengths, its mask) and, where its length is a sample's first dimension, the mask of its
    own steps over the whole batch."""

    argument: str
    beside: frozenset[str]
    mask: torch.Tensor | None


class Gate(threading.local):
    """The per-request sampling decision that every hook reads.

    TorchServe runs one request batch at a time per worker, but a thread-local keeps the gate
    correct if a model is ever driven from several threads. ``open`` is a plain attribute of
    the thread-local (the class value is the default on a new thread): every hook call of every
    request reads it, and a property would double the cost of a closed gate.

    While open, ``rows`` names the rows of the batch to capture (the sampled requests of a
    batch whose other requests were not sampled; None: every row) out of ``batch`` rows, and
    ``mask`` holds the forward's attention mask ``[rows, T]`` once the model's mask pre-hook
    has read it: hooks reduce token activations over the tokens it marks.

    ``record``, when the opener gives one, is where the hooks put their captures, a plain
    tuple of :class:`Capture`'s fields per layer (a layer called again replaces its entry),
    instead of offering a :class:`Capture` to the sink: the request gate's record, read back
    when the forward ends. It saves a named tuple, a call into the sink and a conversion per
    capture on a sampled forward's path.
    """

    open: bool = False
    rows: torch.Tensor | None = None
    batch: int = 0
    mask: torch.Tensor | None = None
    record: dict[str, PlainCapture] | None = None
    #: ``batch`` while the gate is open onto a record with every row captured and no mask
    #: read, else -1: the one read of the thread-local with which a hook's short path checks
    #: all four (each read of a thread-local attribute costs a dictionary switch).
    whole: int = -1
    #: A forward of ``input.arguments`` one of which is padded: how the input's hook reads
    #: them (:func:`read_padded`); None otherwise.
    steps_of: StepsOf | None = None

    def set(
        self,
        value: bool,
        rows: torch.Tensor | None = None,
        batch: int = 0,
        record: dict[str, PlainCapture] | None = None,
    ) -> None:
        self.open = value
        self.rows = rows if value else None
        self.batch = batch
        self.record = record if value else None
        # A mask belongs to one forward: the next one's pre-hook reads its own.
        self.mask = None
        self.steps_of = None
        self.whole = batch if value and rows is None and record is not None else -1


def _is_scripted(module: nn.Module) -> bool:
    return isinstance(module, torch.jit.ScriptModule)


def describe_model(model: nn.Module) -> str | None:
    """What hooks can and cannot see in ``model``, when it is not a plain eager module."""
    if _is_scripted(model):
        return "TorchScript: forward hooks cannot be registered on it; serve it wrapped"
    inner = getattr(model, "_orig_mod", None)
    if isinstance(inner, nn.Module):
        return (
            "torch.compile: hooks are registered on the original module and run inside the "
            "compiled forward (each hooked module is a graph break)"
        )
    for name, module in model.named_modules():
        if name and _is_scripted(module):
            return (
                f"contains TorchScript ({name}): hooks see its input and output, never the "
                "layers inside it"
            )
    return None


def _eager(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, never traced by ``torch.compile``: called where a compiled graph meets
    it, it runs as plain Python between two graphs."""
    disable: Callable[..., Callable[..., Any]] = torch.compiler.disable  # untyped in torch
    return disable(function, recursive=True)


def has_compiled_parts(model: nn.Module) -> bool:
    """True if ``model`` or a module inside it is compiled (``torch.compile(module)`` or
    ``module.compile()``): its hooks then run inside a traced graph."""
    return any(
        isinstance(getattr(m, "_orig_mod", None), nn.Module)
        or getattr(m, "_compiled_call_impl", None) is not None
        for m in model.modules()
    )


def watchable_modules(root: nn.Module) -> dict[str, nn.Module]:
    """``root``'s named modules but itself and the parametrizations of a parametrized module
    (``weight_norm``, ``spectral_norm``: they compute its weight, not an activation)."""
    modules = {}
    hidden: tuple[str, ...] = ()
    for name, module in root.named_modules():
        if not name or f"{name}.".startswith(hidden):
            continue
        modules[name] = module
        if parametrize.is_parametrized(module):
            hidden = (*hidden, f"{name}.parametrizations.")
    return modules


def module_type(module: nn.Module) -> str:
    """A module's class name as its author wrote it: ``Linear`` for the ``ParametrizedLinear``
    that ``weight_norm`` makes of one, and for a ``torch.export`` program's submodule the
    class it was exported from (its ``hookwatch_type``)."""
    authored = getattr(module, "hookwatch_type", None)
    if isinstance(authored, str):
        return authored
    return parametrize.type_before_parametrizations(module).__name__


def hookable_root(model: nn.Module) -> nn.Module:
    """The module whose ``named_modules()`` names the layers: for a ``torch.compile`` model,
    the original module it wraps (its hooks fire in the compiled forward too); for a wrapper
    that names its own (``hookwatch_root``: a ``torch.export`` program's), that one."""
    inner = getattr(model, "_orig_mod", None)
    if isinstance(inner, nn.Module):
        return inner
    attribute = getattr(type(model), "hookwatch_root", None)
    inner = getattr(model, attribute, None) if isinstance(attribute, str) else None
    return inner if isinstance(inner, nn.Module) else model


def resolve_layers(
    model: nn.Module, config: MonitoringConfig, model_name: str = "model"
) -> MonitoringConfig:
    """``config`` with its layer patterns and types resolved into module paths of ``model``.

    Globs (``features.*``) match ``named_modules()`` paths, types match a module's class name;
    exact paths stay in the order given, matches follow the model's order. An entry that
    matches nothing, a module inside a TorchScript model (hooks never fire there) or more than
    ``max_layers`` layers fail the load with what was expected and what came.
    """
    root = hookable_root(model)
    modules = watchable_modules(root)
    chosen: list[str] = []
    for entry in config.layers:
        if GLOB_CHARS & set(entry):
            matches = [name for name in modules if fnmatch.fnmatchcase(name, entry)]
            if not matches:
                raise ConfigError(
                    f"monitoring.layers: expected pattern {entry!r} to match a module path, got "
                    f"no match (the model has: {_sample(modules)})"
                )
            chosen.extend(matches)
        else:
            resolve_layer(root, entry)
            chosen.append(entry)
    for type_name in config.layer_types:
        matches = [name for name, m in modules.items() if module_type(m) == type_name]
        if not matches:
            present = sorted({module_type(m) for m in modules.values()})
            raise ConfigError(
                f"monitoring.layer_types: expected a module class of the model, got "
                f"{type_name!r} (the model has: {', '.join(present)})"
            )
        chosen.extend(matches)
    layers = tuple(dict.fromkeys(chosen))  # first occurrence wins
    for reserved in (INPUT_LAYER, OUTPUT_LAYER):
        if reserved in layers:
            raise ConfigError(
                f"monitoring.layers: expected no module named {reserved!r} (a reserved layer "
                "name), got one; rename the module"
            )
    if len(layers) > config.max_layers:
        raise ConfigError(
            f"monitoring.layers: expected at most {config.max_layers} layers "
            f"(monitoring.max_layers), got {len(layers)} from {list(config.layers)} and types "
            f"{list(config.layer_types)} ({', '.join(layers[:6])}, ...); narrow the patterns "
            "or raise max_layers"
        )
    scripted = [name for name in layers if _inside_script(root, name)]
    if scripted or (layers and _is_scripted(root)):
        raise ConfigError(
            f"monitoring.layers: expected eager modules, got {scripted or list(layers)} inside "
            "a TorchScript model, where forward hooks never fire; watch input and output only "
            "(layers: []) or serve the eager model"
        )
    if config.resolved and layers == config.layers:
        return config
    log.info(
        "hookwatch: model %r: watching %d layers: %s", model_name, len(layers), ", ".join(layers)
    )
    return dataclasses.replace(config, layers=layers, layer_types=())


@dataclasses.dataclass(frozen=True)
class WatchPlan:
    """What is watched on one model, resolved against it once by :func:`plan_watch`.

    ``config.layers`` are the model's module paths (patterns and types matched, checked); the
    model it was resolved against is held weakly, as the hooks hold modules. The Monitor takes
    a plan and never resolves; :func:`hookwatch.watch`, the serving adapter and the profile
    builder each make one, once.
    """

    #: The monitoring config, its ``layers`` resolved into module paths of the model.
    config: MonitoringConfig
    #: The ``model`` label of the model's series.
    model_name: str
    #: The model the plan was resolved against.
    model_ref: weakref.ReferenceType[nn.Module] = dataclasses.field(repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.config.resolved:
            raise ConfigError(
                f"monitoring.layers: expected module paths resolved against the model "
                f"(plan_watch), got patterns {list(self.config.layers)} and types "
                f"{list(self.config.layer_types)}"
            )

    @property
    def watched(self) -> tuple[str, ...]:
        """Every ``layer`` label: the input, the resolved layers, the output, as configured."""
        return self.config.watched

    def check(self, model: nn.Module) -> None:
        """Fail when ``model`` is not the model this plan was resolved against."""
        if self.model_ref() is not model:
            raise ValueError(
                f"expected the model the watch plan of {self.model_name!r} was resolved "
                "against (plan_watch(model, config)), got another"
            )


def plan_watch(
    model: nn.Module,
    config: MonitoringConfig | Mapping[str, Any] | None = None,
    model_name: str = "model",
) -> WatchPlan:
    """Resolve ``config`` (a :class:`MonitoringConfig` or a ``monitoring:`` mapping) against
    ``model``, once: the plan a Monitor takes (:func:`resolve_layers` says what is checked)."""
    resolved = resolve_layers(model, as_monitoring_config(config), model_name)
    return WatchPlan(resolved, model_name, weakref.ref(model))


def _inside_script(root: nn.Module, path: str) -> bool:
    module: nn.Module = root
    for part in path.split("."):
        if _is_scripted(module):
            return True
        module = getattr(module, part)
    return _is_scripted(module)


def _sample(modules: Mapping[str, nn.Module]) -> str:
    names = list(modules)
    return ", ".join(names[:12]) + (" ..." if len(names) > 12 else "")


def resolve_layer(model: nn.Module, path: str) -> nn.Module:
    """Find a dotted ``named_modules()`` path; unknown paths fail with the closest matches."""
    modules = dict(model.named_modules())
    if path in modules and path != "":
        found: nn.Module = modules[path]
        return found
    names = [n for n in modules if n]
    try:
        alias = model.get_submodule(path) if path else None
    except AttributeError:
        alias = None
    if alias is not None:
        # One module registered under two names: named_modules() gives it its first only,
        # and hooks (hence metrics) go by that one.
        canonical = next(n for n, m in modules.items() if m is alias)
        raise ConfigError(
            f"monitoring.layers: expected a module's first name, got {path!r}, which is the "
            f"module {canonical!r} registered again under another name: watch it as "
            f"{canonical!r} (it runs under both)"
        )
    close = difflib.get_close_matches(path, names, n=5, cutoff=0.5)
    hint = f"; close matches: {', '.join(close)}" if close else ""
    sample = ", ".join(names[:12]) + (" ..." if len(names) > 12 else "")
    raise ConfigError(
        f"monitoring.layers: expected a module path of the model, got {path!r}{hint} "
        f"(the model has: {sample})"
    )


def _quantized_units_last() -> tuple[type[nn.Module], ...]:
    """The quantized forms of those below, no subclasses of them (quantize_dynamic's LSTM and
    Linear, a static model's Linear): read as their float forms, never a step as a unit.
    None on a torch without them (imported with torch itself where they exist)."""
    try:
        quantized = torch.ao.nn.quantized
        dynamic = quantized.dynamic
        return (
            dynamic.modules.rnn.RNNBase,
            dynamic.LSTMCell,
            dynamic.GRUCell,
            dynamic.RNNCell,
            dynamic.Linear,
            quantized.Linear,
            quantized.LayerNorm,
            quantized.Embedding,
        )
    except AttributeError:
        return ()


#: Modules whose activations hold their features in the LAST dimension: a sequence's
#: ``[B, T, H]`` (or a channels-last map) is read as its ``H`` units, each averaged over the
#: other dimensions. Recurrent, attention and transformer blocks, and the modules that act on
#: the last dimension whatever comes before it.
UNITS_LAST_TYPES: tuple[type[nn.Module], ...] = (
    nn.RNNBase,
    nn.RNNCellBase,
    nn.MultiheadAttention,
    nn.Transformer,
    nn.TransformerEncoder,
    nn.TransformerDecoder,
    nn.TransformerEncoderLayer,
    nn.TransformerDecoderLayer,
    nn.Linear,
    nn.Bilinear,
    nn.LayerNorm,
    nn.Embedding,
    # nn.RMSNorm came with torch 2.4; the core supports torch 2.1 and later.
    *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),
    *_quantized_units_last(),
)

#: Modules whose activations are channels-first, ``[B, C, ...]``: read as their ``C`` channels,
#: each averaged over the positions after it.
CHANNELS_FIRST_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.conv._ConvNd,
    nn.modules.batchnorm._BatchNorm,
    nn.modules.instancenorm._InstanceNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
    nn.modules.pooling._MaxPoolNd,
    nn.modules.pooling._AvgPoolNd,
    nn.modules.pooling._AdaptiveAvgPoolNd,
    nn.modules.pooling._AdaptiveMaxPoolNd,
    nn.modules.pooling._LPPoolNd,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.Upsample,
    nn.PixelShuffle,
)

#: Activations of any number of dimensions above two are read by the last dimension.
ANY_DIMS = 1 << 16


class FeatureReading(NamedTuple):
    """Which dimension of a layer's activations holds its drift features, decided once per
    module by :func:`feature_reading`.

    ``units_last``: the last dimension (units, averaged over the steps or positions between
    the batch and it), for activations of three dimensions up to ``max_dims``; otherwise,
    and always for two-dimensional ones, dimension 1 (channels, averaged over what follows).
    ``by`` says which rule decided: ``"type"`` (the module's own class), ``"inside"`` (the last
    module of a known class inside it), ``"after"`` (the module of a known class registered
    just before it in its parent), ``"default"`` (none: channels-first).
    """

    units_last: bool
    by: str
    #: The class name that decided (empty for "default").
    source: str = ""

    @property
    def max_dims(self) -> int:
        """Up to how many dimensions an activation is read by its last one: any number when
        the module's own class says so, three (``[B, T, H]``) when inferred, none otherwise."""
        if not self.units_last:
            return 0
        return ANY_DIMS if self.by == "type" else 3


def _own_reading(module: nn.Module) -> bool | None:
    if isinstance(module, UNITS_LAST_TYPES):
        return True
    if isinstance(module, CHANNELS_FIRST_TYPES):
        return False
    return None


def _reading_inside(module: nn.Module) -> tuple[bool, str] | None:
    """The module's own reading, else that of the last module of a known class inside it."""
    own = _own_reading(module)
    if own is not None:
        return own, type(module).__name__
    found: tuple[bool, str] | None = None
    for inner in module.modules():
        if inner is not module:
            inner_own = _own_reading(inner)
            if inner_own is not None:
                found = (inner_own, type(inner).__name__)
    return found


def feature_reading(root: nn.Module, path: str) -> FeatureReading:
    """How the activations of the module at ``path`` (``""``: the model itself, its output)
    are read into drift features: the documented rule, decided once, at registration.

    1. By its own class: recurrent, attention and transformer blocks and ``Linear``,
       ``Bilinear``, ``LayerNorm``, ``RMSNorm``, ``Embedding`` (:data:`UNITS_LAST_TYPES`) are
       read by their last dimension; convolutions, batch/instance/group norms, pooling,
       channel dropout, ``Upsample``, ``PixelShuffle`` (:data:`CHANNELS_FIRST_TYPES`) by
       dimension 1. Subclasses count as their base.
    2. Any other module (an activation, a dropout, your own block): as the last module of a
       known class inside it (a block ending in a ``Linear``), else
    3. as the module of a known class registered just before it in its parent (a ``ReLU``
       after a ``Linear``, a ``Tanh`` after an ``LSTM``). Rules 2 and 3 read only a
       three-dimensional ``[B, T, H]`` by its last dimension: a map of four or more
       dimensions stays channels-first unless the module's own class says otherwise.
    4. None of these: dimension 1 (channels-first, PyTorch's convention).
    """
    module = root.get_submodule(path)  # a path of named_modules(); "" is the root
    own = _reading_inside(module)
    if own is not None:
        by = "type" if _own_reading(module) is not None else "inside"
        return FeatureReading(own[0], by, own[1])
    parent_path, _, name = path.rpartition(".")
    if path:
        parent = root.get_submodule(parent_path)
        siblings = list(parent.named_children())
        before = next((i for i, (n, _) in enumerate(siblings) if n == name), 0)
        for _, sibling in reversed(siblings[:before]):
            found = _reading_inside(sibling)
            if found is not None:
                return FeatureReading(found[0], "after", found[1])
    return FeatureReading(False, "default")


class _Entry(NamedTuple):
    """One registered hook as :meth:`HookSet.arm` puts it back: ``table[key] = function``
    (and ``kwargs_table[key] = True`` for a pre-hook that takes keyword arguments), or, for
    an output hook on a module with no forward hooks and no ``forward`` of its own instance,
    ``attributes["forward"] = tap`` (see :meth:`LayerHook.entry`)."""

    hook: LayerHook
    table: dict[int, Any]
    key: int
    function: Callable[..., Any]
    kwargs_table: dict[int, bool] | None
    #: The module's ``__dict__``, where a tap goes.
    attributes: dict[str, Any]
    #: The forward tap (:meth:`LayerHook._tap`); None for a hook that has none.
    tap: Callable[..., Any] | None


class LayerHook:
    """One hook on one module: the unit that can be faulted, registered and removed.

    Built unregistered; :meth:`register` and :meth:`unregister` put it on its module and take
    it off, any number of times. ``state`` says whether it is in use at all, not whether it is
    registered right now.
    """

    def __init__(
        self,
        name: str,
        module: nn.Module,
        gate: Gate,
        sink: CaptureSink,
        max_features: int,
        on_input: bool = False,
        copy_limit: int = 0,
        width: int | None = None,
        select: int | str | None = None,
        host: bool = True,
        reading: FeatureReading | None = None,
        logits: bool = False,
        joins: bool = False,
        probabilities: str | None = None,
        items: str | None = None,
        steps: bool | None = None,
    ) -> None:
        self.name = name
        #: Activations of 3 to ``_last_dims`` dimensions are read by their last one (units);
        #: decided once, from the module's type (see :func:`feature_reading`).
        self.reading = reading if reading is not None else FeatureReading(False, "default")
        self._last_dims = self.reading.max_dims
        # A channels-first module by its own class is never a hidden state of tokens, nor an
        # output of a fixed number of steps (``output.steps: false``).
        self._tokens = steps is not False and not (
            self.reading.by == "type" and not self.reading.units_last
        )
        #: The output of a ``logits`` head: ``[batch, classes]`` is read as any layer,
        #: ``[batch, positions, classes]`` by :func:`position_summary`, a class map
        #: ``[batch, classes, *spatial]`` (segmentation) as the positions of its pixels.
        self._logits = logits
        #: Hand host tensors off as numpy arrays (see :func:`hold`).
        self._host = host
        self._select = select
        #: The output is a list of one tensor a sample (``output.items``): read as one dict
        #: a sample under this key (:func:`as_items`).
        self._items = items
        self._copy_limit = copy_limit
        self._module_ref: weakref.ReferenceType[nn.Module] = weakref.ref(module)
        self._gate = gate
        self._sink = sink
        # A projected layer keeps its projection's input width instead of the budget.
        self._max_features = max_features if width is None else width
        #: A pre-hook on the model's input rather than a hook on a module's output: the
        #: input keeps a small map whole (``flatten``) and its token ids are ``[B, T]``.
        self._reads_input = on_input
        #: The model's input given as several keyword arguments is read whole, all of them
        #: side by side (:func:`joined_inputs`), not the first alone (no mask configured: a
        #: text model's ids are read with their mask instead).
        self._joins = joins
        #: The output's head where its values are probabilities (``output.probabilities``):
        #: read through :func:`as_logits`.
        self._probabilities = probabilities
        #: The id torch gave this hook at its first registration, kept for the next ones.
        self._id: int | None = None
        self._on = False
        self.state = HookState.ATTACHED
        #: Which dimension of this layer's activations holds the batch's rows: 1 for a
        #: sequence-first layer (``nn.LSTM``, ``nn.GRU``, ``nn.MultiheadAttention`` and
        #: ``nn.Transformer*`` without ``batch_first``: ``[T, B, ...]``). Learnt from shapes.
        self.batch_dim = 0
        #: The caller hands this hook its value (:meth:`take`) instead of the module: never
        #: registered (see :meth:`HookSet.take_root`).
        self.by_caller = False
        #: What the last capture was, when it was the common one (a plain host tensor copied
        #: whole, no rows picked, no mask): an activation of the same shape and dtype in a
        #: forward of the same batch is copied at once by :meth:`take`, without the general
        #: path's decisions, which would come out the same (~150 bytecodes a layer fewer on
        #: every sampled forward, docs/bench/request.md). None: take the general path.
        self._fast_shape: torch.Size | None = None
        self._fast_dtype: torch.dtype | None = None
        self._fast_batch = -2  # never a Gate.whole
        self._fast_units = False
        if not host:
            # A model with compiled parts: TorchDynamo would trace these hooks into the
            # compiled graph with the gate's value at trace time baked in (a graph traced on an
            # unsampled forward never captures that layer again, and guards do not see a
            # thread-local change). Left out of the trace, each runs eagerly on every forward,
            # where the gate is read as it is: a graph break per hooked module.
            self._hook = _eager(self._hook)  # type: ignore[method-assign]
            self._pre_hook = _eager(self._pre_hook)  # type: ignore[method-assign]

    def register(self) -> None:
        """Put the hook on its module (no-op when it is on already, faulted, removed, handed
        to the caller or the module is gone)."""
        if self._on or self.state is not _ATTACHED or self.by_caller:
            return
        module = self._module_ref()
        if module is None:
            return
        key = self._id
        if key is None:
            # The first time through torch's own registration, for its id. Later ones (on
            # demand: every sampled forward) put the same entries back where torch's would
            # (the end of the module's hooks), without a new RemovableHandle and the weak
            # references it takes and reads back on removal, twice per sampled forward.
            if self._reads_input:
                # With the keyword arguments: a forward called as model(features=x) has no args.
                handle = module.register_forward_pre_hook(self._pre_hook, with_kwargs=True)
            else:
                handle = module.register_forward_hook(self._hook)
            self._id = handle.id
        elif self._reads_input:
            module._forward_pre_hooks[key] = self._pre_hook
            module._forward_pre_hooks_with_kwargs[key] = True
        else:
            module._forward_hooks[key] = self._hook
        self._on = True

    def unregister(self) -> None:
        """Take the hook off its module; idempotent, other hooks on it untouched."""
        if not self._on:
            return
        self._on = False
        module = self._module_ref()
        key = self._id
        if module is None or key is None:
            return
        if self._reads_input:
            module._forward_pre_hooks.pop(key, None)
            module._forward_pre_hooks_with_kwargs.pop(key, None)
        else:
            module._forward_hooks.pop(key, None)

    def entry(self) -> _Entry | None:
        """Where this hook sits while registered: the module's hook table, its key, the
        function, and the table of pre-hooks taking keyword arguments (None for an output
        hook); None while not registered through torch's tables (see :meth:`HookSet.arm`)."""
        module = self._module_ref()
        key = self._id
        if not self._on or module is None or key is None:
            return None
        if self._reads_input:
            return _Entry(
                self,
                module._forward_pre_hooks,
                key,
                self._pre_hook,
                module._forward_pre_hooks_with_kwargs,
                module.__dict__,
                None,
            )
        forward = getattr(type(module), "forward", None)
        tap = self._tap(forward) if isinstance(forward, FunctionType) else None
        return _Entry(self, module._forward_hooks, key, self._hook, None, module.__dict__, tap)

    def _tap(self, forward: Callable[..., Any]) -> Callable[..., Any]:
        """The module's class ``forward``, then this hook on its output: what
        :meth:`HookSet.arm` puts in the module's ``__dict__`` as ``forward`` for a sampled
        forward, in place of a forward hook.

        A module with any hook goes through PyTorch's general call path, ~1 µs a call more
        than the hook-free one (a closure, a set, the hook tables read; docs/bench/request.md);
        with the tap the module has no hook, and ``Module.__call__`` calls the tap as its
        forward. The output it sees is the forward's, where a forward hook sees it after
        other forward hooks: so a module with hooks of its own keeps a hook (see arm). The
        module is held weakly, as the hook holds it."""
        module_ref = self._module_ref
        take = self.take

        def forward_tap(*args: Any, **kwargs: Any) -> Any:
            output = forward(module_ref(), *args, **kwargs)
            take(output)  # never raises
            return output

        forward_tap.__wrapped__ = forward  # type: ignore[attr-defined]
        # What inspect.signature(module.forward) gives without the tap: the bound method's
        # parameters, not the tap's (*args, **kwargs) nor the function's with ``self``.
        with contextlib.suppress(ValueError, TypeError):
            signature = inspect.signature(forward)
            parameters = list(signature.parameters.values())[1:]
            forward_tap.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        return forward_tap

    @property
    def registered(self) -> bool:
        return self._on

    # The gate first: it is closed on most calls, and reading it is the cheaper test.
    # ``kwargs`` has a default: PyTorch snapshots a module's hooks before calling them but
    # looks up which take keyword arguments at call time, so a hook removed by another thread
    # in between is called without them.
    def _pre_hook(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None
    ) -> None:
        if self._gate.open and self.state is _ATTACHED:
            if args:
                self.take(args[0])
            else:
                given = kwargs or {}
                self.take(
                    joined_inputs(given, self._max_features, self._gate.steps_of)
                    if self._joins
                    else select_tensor(given)
                )

    def _hook(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        self.take(output)

    def take(self, value: Any) -> None:
        """Capture ``value`` as the module's hook would: its output (the forward hook and the
        forward tap call this), or its input from a caller that holds it (the service, for
        the model's own, :meth:`HookSet.take_root`); a no-op while the gate is closed or the
        hook is off. Never raises."""
        gate = self._gate
        # The common capture again (see _fast_shape): every check of the general path whose
        # outcome could differ, in one expression (the gate open onto a record, the whole
        # batch, no mask: ``whole``); inline, it runs for every hooked layer of every sampled
        # forward. Not checked: the device and the grad, the same from one forward to the
        # next (the short path is armed only for a host tensor without grad); a model moved
        # to a device, or run with grad, makes numpy() raise, and the general path takes it
        # from there.
        if (
            gate.whole == self._fast_batch
            and type(value) is torch.Tensor
            and not value.is_nested  # a nested tensor has no shape to ask for
            and value.shape == self._fast_shape
            and value.dtype is self._fast_dtype
            and self.state is _ATTACHED
            and not _COMPILER._is_compiling_flag
        ):
            try:
                held = value.numpy().copy()
            except Exception:  # the general path decides what it is
                self._capture(value)
                return
            if self._fast_units:
                held = held.swapaxes(1, -1)
            gate.record[self.name] = (self.name, None, None, held)  # type: ignore[index]
            return
        if gate.open and self.state is _ATTACHED:
            self._capture(value)

    def _capture(self, value: Any) -> None:
        # The general path: it decides afresh, and re-arms the fast one when it ends in the
        # common case.
        self._fast_shape = None
        try:
            if self._items is not None:
                value = as_items(value, self._items)
            if type(value) is torch.Tensor and self._select is None and not value.is_nested:
                tensor: torch.Tensor | None = value
            elif self._joins and isinstance(value, Mapping):
                tensor = joined_inputs(value, self._max_features, self._gate.steps_of)
            else:
                tensor = select_tensor(value, self._select)
            if tensor is None:
                raise TypeError(
                    f"expected a tensor (select={self._select!r}), got {type(value).__name__}"
                )
            gate = self._gate
            owned = False
            if tensor.is_quantized:
                # A statically quantized model's (quint8, qint8): its real values, a new tensor.
                tensor = tensor.dequantize()
                owned = True
            if self._probabilities is not None:
                # The output's probabilities read as the logits its head takes.
                tensor = as_logits(tensor, self._probabilities)
                owned = True
            shape = tensor.shape
            dims = len(shape)
            batch = gate.batch
            if dims > 2 and batch:
                # Which of the first two dimensions is the batch's: when exactly one has its
                # size, that one (a sequence-first layer's [T, B, H] is read through a
                # transposed view); when both or neither, the layer's last decision stands
                # (the first until one is made), so a sequence as long as the batch does not
                # flip it. Two-dimensional activations are left as they are: [N, 4] boxes of
                # a batch of 4 are not sequence-first. Inline: this runs in every sampled call.
                first = shape[0] == batch
                if first is not (shape[1] == batch):
                    self.batch_dim = 0 if first else 1
                if self.batch_dim:
                    tensor = tensor.transpose(0, 1)
                    shape = tensor.shape
            if gate.rows is not None and dims and shape[0] == batch:
                # Only the rows of the requests the per-second cap let through (a sampled
                # forward is otherwise captured whole); index_select copies them (owned
                # storage).
                picked = gate.rows
                if picked.device != tensor.device:
                    picked = picked.to(tensor.device)
                tensor = tensor.detach().index_select(0, picked)
                shape = tensor.shape
                owned = True
            mask = gate.mask
            if self._logits and dims > 2:
                if dims > 3:
                    # A class map [B, C, *spatial] (segmentation: classes first, as a
                    # convolution gives them): per-position logits over its pixels.
                    tensor = tensor.flatten(2).transpose(1, 2)
                    shape = tensor.shape
                # Per-position logits [B, T, C]: reduced here, never copied raw (the capture
                # thread reads a raw copy's rows as a layer's features).
                positions = (
                    mask if mask is not None and self._tokens and mask.shape == shape[:2] else None
                )
                self._keep(
                    gate,
                    hold(reduce_activation(tensor), True, self._host),
                    hold(position_summary(tensor, positions), True, self._host),
                )
                return
            if mask is not None and self._is_tokens(tensor, mask, gate):
                stats, features = token_summary(tensor, mask, self._max_features)
                self._keep(gate, hold(stats, True, self._host), hold(features, True, self._host))
                return
            # From sizes alone: indexing a sample would be one more torch call per hook.
            numel = tensor.numel()
            # A sequence's [B, T, H] is read by its units: H goes to dimension 1, where a
            # channels-first map has its features, as a view (the statistics do not depend on
            # the order of a sample's values).
            units = 2 < dims <= self._last_dims
            if dims and (numel // shape[0] if shape[0] else numel) <= self._copy_limit:
                # The copy is taken now, before any later in-place operation can change it;
                # swapping the axes of the copy is a view, cheaper than copying a strided one.
                held = hold(tensor, owned, self._host)
                if units:
                    held = held.swapaxes(1, -1)
                if (
                    _FAST_CAPTURE
                    and tensor is value
                    and gate.whole == batch
                    and self._select is None
                    and type(held) is np.ndarray
                    and not tensor.requires_grad
                ):
                    # The value itself was copied whole to the host (not selected, picked,
                    # transposed or dequantized): the same shape, dtype and batch next time
                    # come out the same (see take).
                    self._fast_shape, self._fast_dtype = shape, tensor.dtype
                    self._fast_batch, self._fast_units = batch, units
                # Into the gate's record as it is (see Gate.record), else through the sink:
                # inline, this is every sampled call of every layer.
                record = gate.record
                if record is not None:
                    record[self.name] = (self.name, None, None, held)
                else:
                    self._sink.offer(Capture(self.name, None, None, held))
                return
            self._keep(
                gate,
                hold(reduce_activation(tensor), True, self._host),
                hold(
                    feature_summary(
                        tensor.movedim(-1, 1) if units else tensor,
                        self._max_features,
                        self._reads_input,
                    ),
                    True,
                    self._host,
                ),
            )
        except Exception as error:  # a monitor must never fail the request
            self.state = HookState.FAULTED
            with contextlib.suppress(Exception):
                self._sink.on_fault(self.name, error)

    def _keep(self, gate: Gate, stats: Held, features: Held) -> None:
        """Hand off a capture the hook reduced: into the gate's record, else to the sink."""
        record = gate.record
        if record is not None:
            record[self.name] = (self.name, stats, features, None)
        else:
            self._sink.offer(Capture(self.name, stats, features))

    def _is_tokens(self, tensor: torch.Tensor, mask: torch.Tensor, gate: Gate) -> bool:
        """A hidden state ``[B, T, H]`` (or the input's token ids ``[B, T]``) of this forward's
        mask: the shape decides, so a pooled ``[B, H]`` or attention weights
        ``[B, heads, T, T]`` are reduced as any other activation. Not the input where its
        arguments were joined (:func:`joined_inputs` read the padded one by its steps)."""
        if tensor.shape[:2] != mask.shape or not self._tokens:
            return False
        if self._reads_input and gate.steps_of is not None:
            return False
        return tensor.dim() == 3 or (tensor.dim() == 2 and self._reads_input)

    @property
    def module(self) -> nn.Module | None:
        return self._module_ref()

    def remove(self) -> None:
        self.unregister()
        self.state = HookState.DETACHED


def steps_of(padded: Padded) -> StepsOf | None:
    """How :func:`joined_inputs` reads a padded batch of several arguments (None for a lone
    padded input)."""
    if padded.field is None:
        return None
    return StepsOf(padded.field, frozenset(padded.keywords()), padded.step_mask())


def read_padded(gate: Gate, padded: Padded) -> None:
    """Give the open ``gate`` what a padded batch tells its hooks: the mask of its steps
    (:func:`read_mask`) where its length is a sample's first dimension and, for a padded one
    of several arguments, which it is (:func:`steps_of`)."""
    gate.steps_of = steps_of(padded)
    steps = padded.step_mask()
    if steps is not None:
        read_mask(gate, steps)


def read_mask(gate: Gate, mask: torch.Tensor) -> None:
    """Give the open ``gate`` this forward's mask ``[batch, steps]``: its hooks reduce token
    (step) activations over the positions it marks, padding left out. Only the captured rows'
    when the gate picked some."""
    rows = gate.rows
    if rows is not None and mask.shape[0] == gate.batch:
        mask = mask.index_select(0, rows.to(mask.device))
    gate.mask = mask
    gate.whole = -1  # the hooks reduce token activations over it: the general path


class MaskHook:
    """Reads each captured forward's attention mask into the gate: a pre-hook on the model,
    run before any other, so every hook of that forward reduces its token activations over
    the same tokens.

    ``argument`` names the forward's keyword argument holding the mask, or its position. A
    forward called without it has no padding: every token counts (a mask of ones shaped like
    the first tensor argument with two or more dimensions, the token ids).
    """

    def __init__(self, model: nn.Module, gate: Gate, sink: CaptureSink, argument: str | int):
        self._gate = gate
        self._sink = sink
        self._argument = argument
        self._model_ref: weakref.ReferenceType[nn.Module] = weakref.ref(model)
        self.state = HookState.ATTACHED
        self._handle: RemovableHandle | None = None

    def register(self) -> None:
        """Put the pre-hook on the model, ahead of every other pre-hook it has."""
        model = self._model_ref()
        if self._handle is not None or self.state is not HookState.ATTACHED or model is None:
            return
        self._handle = model.register_forward_pre_hook(
            self._pre_hook, with_kwargs=True, prepend=True
        )

    def unregister(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.remove()

    def _pre_hook(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None
    ) -> None:
        gate = self._gate
        if not gate.open or self.state is not HookState.ATTACHED:
            return
        kwargs = kwargs or {}
        try:
            # The tokens together as one dict under one keyword (input.argument): read inside.
            together = next((v for v in (*kwargs.values(), *args) if isinstance(v, Mapping)), None)
            if together is not None:
                kwargs = {**kwargs, **together}
            argument = self._argument
            if isinstance(argument, str):
                mask = kwargs.get(argument)
            else:
                mask = args[argument] if argument < len(args) else None
            # The first tensor of two dimensions or more (the ids, the padded steps): looked
            # for only where the mask is to be made from it, not on every text forward.
            first = (
                next(
                    (
                        v
                        for v in (*args, *kwargs.values())
                        if isinstance(v, torch.Tensor) and v.dim() >= 2
                    ),
                    None,
                )
                if mask is None or _is_lengths(mask)
                else None
            )
            if mask is None:
                if first is None:
                    gate.mask = None
                    return
                mask = torch.ones(first.shape[:2], dtype=torch.bool, device=first.device)
            elif first is not None and first.shape[0] == mask.shape[0]:
                # Each sample's length (pack_padded_sequence's): its steps of the padded
                # batch's, the first tensor's second dimension.
                steps = torch.arange(first.shape[1], device=mask.device)
                mask = steps[None, :] < mask[:, None]
            if not (isinstance(mask, torch.Tensor) and mask.dim() == 2):
                raise TypeError(
                    f"expected the attention mask (monitoring.mask={argument!r}) to be a tensor "
                    f"[batch, tokens] or the lengths [batch], got {type(mask).__name__} "
                    f"{list(mask.shape) if isinstance(mask, torch.Tensor) else ''}".rstrip()
                )
            read_mask(gate, mask)
        except Exception as error:  # a monitor must never fail the request
            gate.mask = None
            self.state = HookState.FAULTED
            with contextlib.suppress(Exception):
                self._sink.on_fault(ALL_LAYERS, error)

    def remove(self) -> None:
        self.unregister()
        self.state = HookState.DETACHED


def _is_lengths(value: Any) -> bool:
    """An integer tensor ``[batch]``: each sample's length, not a mask."""
    return (
        isinstance(value, torch.Tensor)
        and value.dim() == 1
        and not value.is_floating_point()
        and value.dtype != torch.bool
    )


def joined_inputs(
    kwargs: Mapping[str, Any], max_features: int = 256, steps: StepsOf | None = None
) -> torch.Tensor | None:
    """A forward's keyword arguments as the one input the hooks read: a lone tensor as it
    is; several side by side in call order, float32 ``[batch, features]``, each read as a lone
    input would be (whole where all fit in ``max_features`` values side by side, else a map
    past its share of them by its channels' means), so a drift in any of them is the
    input's (``input.arguments``). Where
    they do not all have the batch first, the first tensor, as for any other call.

    With ``steps`` (one argument padded to the batch's longest), its lengths and mask are
    left out and the padded argument is read by its own steps, a width no batch changes:
    ``[B, T, F]`` by each feature's mean, ``[B, T]`` by its length (and a series' mean and
    spread), as :func:`token_summary` reads a lone input; a length elsewhere than a sample's
    first dimension by its channels' means."""
    if len(kwargs) == 1:
        (only,) = kwargs.values()
        if isinstance(only, Mapping):
            kwargs = only  # the arguments as one dict (input.argument beside input.arguments)
    if steps is not None:
        kwargs = {name: value for name, value in kwargs.items() if name not in steps.beside}
    named = [(name, value) for name, value in kwargs.items() if isinstance(value, torch.Tensor)]
    if len(named) < 2 and steps is None:
        return named[0][1] if named else None
    if not named:
        return None
    first = named[0][1]
    rows = first.shape[0] if first.dim() else -1
    if any(t.dim() == 0 or t.shape[0] != rows for _, t in named):
        return first
    # Whole where they fit side by side; else each map past its share of the width by its
    # channels' means (two 3x32x32 images under a width of 4096 were joined whole, 6144
    # values, and the second cut off at 4096: its drift unseen).
    widths = [math.prod(t.shape[1:]) for _, t in named]
    share = max_features if sum(widths) <= max_features else max_features // len(named)
    parts = [
        _own_steps_read(t, steps, max_features)
        if steps is not None and name == steps.argument
        else t.reshape(rows, -1).float()
        if t.dim() <= 2 or width <= share
        else t.reshape(rows, t.shape[1], -1).float().mean(dim=2)
        for (name, t), width in zip(named, widths, strict=True)
    ]
    return torch.cat(parts, dim=1)


def _own_steps_read(tensor: torch.Tensor, steps: StepsOf, max_features: int) -> torch.Tensor:
    """The padded argument of :func:`joined_inputs` as features of a fixed width."""
    mask = steps.mask
    if mask is not None and tensor.dim() in (2, 3) and tensor.shape[:2] == mask.shape:
        return token_summary(tensor, mask, max_features)[1].float()
    if tensor.dim() >= 3:
        return tensor.reshape(tensor.shape[0], tensor.shape[1], -1).float().mean(dim=2)
    return tensor.reshape(tensor.shape[0], -1).float()


def packed_means(packed: PackedSequence) -> torch.Tensor:
    """A packed batch of sequences (an RNN's output over ``pack_padded_sequence``) as each
    sequence's mean over its own steps, ``[batch, hidden]`` in the batch's order: its data is
    ``[steps of all sequences, hidden]``, rows that are no sample's, and padding would count
    as zeros in a padded mean."""
    padded, lengths = pad_packed_sequence(packed, batch_first=True)
    steps = lengths.to(device=padded.device, dtype=padded.dtype).clamp(min=1)
    return padded.sum(dim=1) / steps.unsqueeze(1)


def nested_means(nested: torch.Tensor) -> torch.Tensor:
    """A nested tensor (each sample's own steps: what ``nn.TransformerEncoder`` passes
    between its layers in inference given a padding mask) as each sample's mean over its
    steps, ``[batch, *features]``: it has no one shape to read, and its padding is no
    sample's, as a packed sequence's is not (:func:`packed_means`)."""
    return torch.stack([part.float().mean(dim=0) for part in nested.unbind()])


def select_tensor(value: Any, select: int | str | None = None) -> torch.Tensor | None:
    """The tensor to watch in a module's output (or input).

    ``select`` picks a tuple/list item by index, or a dict item (a HuggingFace ``ModelOutput``
    is a dict) or attribute by name; without it, the value itself if it is a tensor, else its
    first tensor (nested items and dataclass fields included, a few levels down). None when
    there is no such tensor.
    """
    if per_sample_items(value):
        # One dict a sample (a detector's boxes, scores, labels): read per sample, each
        # entry's count and mean (``select`` naming an entry keeps that one).
        return per_sample_summary(value, select if isinstance(select, str) else None)
    if select is not None:
        try:
            if isinstance(select, int) or isinstance(value, Mapping):
                value = value[select]
            else:
                value = getattr(value, select)
        except (IndexError, KeyError, AttributeError, TypeError):
            return None
    return _first_tensor(value, 3)


def as_logits(probabilities: torch.Tensor, head: str) -> torch.Tensor:
    """Probabilities as the logits a head takes (``output.probabilities``): ``log(p)`` for a
    softmax's (the softmax of it is ``p`` again), ``log(p / (1 - p))`` for a sigmoid's (a
    ``multilabel`` head's, or a binary classifier's one value a sample), clamped off 0 and 1
    so a saturated probability stays finite."""
    p = probabilities.float()
    if head == "multilabel" or p.dim() == 1 or (p.dim() == 2 and p.shape[1] == 1):
        return torch.logit(p, eps=1e-7)
    return torch.log(p.clamp_min(1e-7))


def as_items(value: Any, key: str | None) -> Any:
    """A list (or tuple) of one tensor a sample as one dict a sample, ``{key: tensor}``
    (``monitoring.output.items``), so it is answered and watched as a detector's dicts are;
    anything else, or ``key`` None, as it is."""
    if (
        key is None
        or not isinstance(value, list | tuple)
        or not value
        or not all(isinstance(t, torch.Tensor) for t in value)
    ):
        return value
    return [{key: t} for t in value]


def per_sample_items(value: Any) -> bool:
    """True for a list or tuple of one dict of tensors per sample, as torchvision's detectors
    answer (``[{"boxes": [K, 4], "scores": [K], "labels": [K]}, ...]``, K varying): its
    tensors are no batch's rows."""
    return (
        isinstance(value, list | tuple)
        and bool(value)
        and all(
            isinstance(item, Mapping)
            and bool(item)
            and all(isinstance(t, torch.Tensor) for t in item.values())
            for item in value
        )
    )


def per_sample_summary(items: Sequence[Mapping[str, Any]], key: str | None = None) -> torch.Tensor:
    """``[samples, 2 x entries]``: per sample, each entry's count (its first dimension: how
    many boxes) and the mean of its values (0 when empty), in the first sample's key order;
    ``key`` keeps that entry alone (None where it is missing). A detector's drift then reads
    as how many objects it finds and how sure it is."""
    keys = [key] if key is not None else list(items[0])
    device = next(iter(items[0].values())).device
    # Counts are shapes (known on the host); means stay on the tensors' device, so a hook on
    # a GPU model does not wait for it here.
    counts: list[float] = []
    means: list[torch.Tensor] = []
    for item in items:
        for name in keys:
            t = item.get(name)
            if not isinstance(t, torch.Tensor):
                counts.append(math.nan)
                means.append(torch.full((), math.nan, device=device))
                continue
            counts.append(float(t.shape[0]) if t.dim() else 1.0)
            means.append(
                t.detach().float().mean() if t.numel() else t.new_zeros((), dtype=torch.float32)
            )
    shape = (len(items), len(keys))
    count = torch.tensor(counts, dtype=torch.float32).to(device, non_blocking=True)
    mean = torch.stack([m.to(device) for m in means])
    return torch.stack([count.view(shape), mean.view(shape)], dim=2).flatten(1)


def _first_tensor(value: Any, depth: int) -> torch.Tensor | None:
    """``value`` if a tensor, else its first tensor item, else the first tensor found in its
    items (tuples, lists, mappings, dataclass fields), at most ``depth`` levels down: an
    LSTM's ``(out, (h, c))`` gives ``out``, a block's ``((hidden, weights), cache)``
    ``hidden``. A packed sequence counts as a tensor: its sequences' means
    (:func:`packed_means`); a nested tensor's are read the same way (:func:`nested_means`)."""
    if isinstance(value, torch.Tensor):
        return nested_means(value) if value.is_nested else value
    if isinstance(value, PackedSequence):
        return packed_means(value)
    if depth == 0:
        return None
    items: Any
    if isinstance(value, Mapping):
        items = value.values()
    elif isinstance(value, list | tuple):
        items = value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = (getattr(value, f.name) for f in dataclasses.fields(value))
    else:
        return None
    items = list(items)
    for item in items:
        if isinstance(item, torch.Tensor):
            return nested_means(item) if item.is_nested else item
        if isinstance(item, PackedSequence):
            # An RNN's (output, h_n) over packed input: its output, as over padded input
            # (a PackedSequence is a tuple, not a tensor: h_n would come first otherwise).
            return packed_means(item)
    for item in items:
        found = _first_tensor(item, depth - 1)
        if found is not None:
            return found
    return None


class HookSet:
    """All hooks of one model: ``attach()`` once, ``detach()`` any number of times.

    Attached ``on_demand``, the hooks are built but registered only between :meth:`arm` and
    :meth:`disarm`: the request path arms around each sampled forward, so an unsampled one
    runs without any hook of ours on the model. Arming is counted (several threads may run
    sampled forwards at once): the hooks go on at the first arm and come off at the last
    disarm. Otherwise they are registered at ``attach()`` and stay until ``detach()``.

    Usable as a context manager. Holds modules only through weak references.
    """

    def __init__(
        self, gate: Gate, sink: CaptureSink, max_features: int = 256, copy_limit: int = 0
    ) -> None:
        self.gate = gate
        self._sink = sink
        self._max_features = max_features
        self._copy_limit = copy_limit
        self._hooks: dict[str, LayerHook] = {}
        self._mask: MaskHook | None = None
        self.state = HookState.DETACHED
        self.on_demand = False
        # One lock for the arm count and the registrations it decides; taken twice per
        # sampled forward, never by an unsampled one.
        self._arm_lock = threading.Lock()
        self._armed = 0
        #: The registrations of the last arm that went through every hook, put back as they
        #: are by the next ones (:meth:`arm`); None until then, and again whenever a hook's
        #: state or the set changes.
        self._entries: tuple[_Entry, ...] | None = None

    def attach(
        self,
        model: nn.Module,
        layers: Sequence[str],
        capture_input: bool = True,
        capture_output: bool = True,
        widths: Mapping[str, int] | None = None,
        output_select: int | str | None = None,
        mask: int | str | None = None,
        on_demand: bool = False,
        output_head: str | None = None,
        output_probabilities: bool = False,
        output_items: str | None = None,
        output_steps: bool | None = None,
    ) -> HookSet:
        """Build the hooks and, unless ``on_demand``, register them; ``widths`` overrides
        ``max_features`` per layer (projected ones, the output), ``output_select`` picks the
        output's tensor to watch, ``mask`` names the forward's attention-mask argument
        (keyword or position) for token activations, ``output_head`` the output's head (a
        ``logits`` output ``[batch, positions, classes]`` is read per position by
        :func:`position_summary`, and so is a class map ``[batch, classes, *spatial]``, per
        pixel), ``output_probabilities`` that the output is probabilities, read through
        :func:`as_logits`, ``output_items`` that it is a list of one tensor a sample
        (:func:`as_items`), ``output_steps`` False that its steps are a fixed number, never
        read over a padded batch's mask (``output.steps``).

        Which dimension of each layer's activations holds its features is decided here,
        once per module (:func:`feature_reading`); the input keeps dimension 1."""
        if self.state is not HookState.DETACHED:
            raise RuntimeError(f"expected a detached HookSet, got state {self.state.value}")
        if _is_scripted(model):
            raise ConfigError(
                "expected an eager nn.Module, got a TorchScript module: forward hooks are not "
                "supported on it; wrap it in an eager module to watch its input and output"
            )
        # Resolve every path before building anything, so a typo leaves the model untouched.
        root = hookable_root(model)
        targets = [(name, resolve_layer(root, name)) for name in layers]
        if mask is not None:
            self._mask = MaskHook(model, self.gate, self._sink, mask)
        host = not has_compiled_parts(model)
        plan: list[tuple[str, nn.Module, bool]] = []
        if capture_input:
            plan.append((INPUT_LAYER, model, True))
        plan.extend((name, module, False) for name, module in targets)
        if capture_output:
            plan.append((OUTPUT_LAYER, model, False))
        for name, module, on_input in plan:
            self._hooks[name] = LayerHook(
                name,
                module,
                self.gate,
                self._sink,
                self._max_features,
                on_input=on_input,
                copy_limit=self._copy_limit,
                width=None if widths is None else widths.get(name),
                select=output_select if name == OUTPUT_LAYER else None,
                items=output_items if name == OUTPUT_LAYER else None,
                host=host,
                reading=None
                if on_input
                else feature_reading(root, "" if name == OUTPUT_LAYER else name),
                logits=name == OUTPUT_LAYER and output_head == "logits",
                joins=on_input and mask is None,
                probabilities=output_head
                if name == OUTPUT_LAYER and output_probabilities and output_head
                else None,
                steps=output_steps if name == OUTPUT_LAYER else None,
            )
        self.on_demand = on_demand
        self.state = HookState.ATTACHED
        if not on_demand:
            try:
                self._register()
            except BaseException:
                self.detach()
                raise
        return self

    def _register(self) -> None:
        # The mask pre-hook first: it goes ahead of every pre-hook, and every hook of the
        # forward reads the mask it sets.
        if self._mask is not None:
            self._mask.register()
        for hook in self._hooks.values():
            hook.register()

    def _unregister(self) -> None:
        for hook in self._hooks.values():
            hook.unregister()
        if self._mask is not None:
            self._mask.unregister()

    def arm(self, taps: bool = True) -> bool:
        """Register the hooks for a sampled forward (on demand only; counted). Never raises:
        a registration that fails takes every hook off again and is reported as a fault of
        the whole model; that forward is then not captured (False: the caller leaves the
        gate closed, so hooks taken by the caller capture nothing either).

        ``taps=False`` registers forward hooks only, no forward taps (:meth:`hold`)."""
        if not self.on_demand:
            return True
        with self._arm_lock:
            if self.state is not _ATTACHED:
                return False
            self._armed += 1
            if self._armed > 1:
                return True
            entries = self._entries
            if entries is not None:
                # The same registrations as the last arm's, straight into torch's tables:
                # each hook's register() is ~35 Python bytecodes, and this runs for every
                # hook of every sampled forward (docs/bench/request.md). An output hook goes
                # in as a forward tap where the module has no hook and no forward of its
                # own instance (LayerHook._tap), else into the table.
                for hook, table, key, function, kwargs_table, attributes, tap in entries:
                    if hook.state is _ATTACHED:
                        if taps and tap is not None and not table and "forward" not in attributes:
                            attributes["forward"] = tap
                        else:
                            table[key] = function
                            if kwargs_table is not None:
                                kwargs_table[key] = True
                        hook._on = True
                return True
            try:
                self._register()
            except Exception as error:
                self._unregister()
                with contextlib.suppress(Exception):
                    self._sink.on_fault(ALL_LAYERS, error)
                return False
            if self._mask is None:  # its pre-hook goes first: through torch's registration
                found = [hook.entry() for hook in self._hooks.values()]
                self._entries = tuple(entry for entry in found if entry is not None)
            return True

    def hold(self) -> bool:
        """:meth:`arm` for as long as the sample rate stays 1 (the gate's pin), between
        forwards too: with forward hooks only. A tap left on a module between forwards would
        go with it into a ``copy.deepcopy`` of the model, and the copy would run the original
        module's forward without a word; a model with hookwatch's hooks on cannot be deep-copied
        at all (the thread-local gate cannot be), which fails loudly instead."""
        return self.arm(taps=False)

    def disarm(self) -> None:
        """Undo one :meth:`arm`: the last one takes every hook off again. Never raises."""
        if not self.on_demand:
            return
        with self._arm_lock:
            if self._armed == 0:  # detached in between: nothing is registered
                return
            self._armed -= 1
            if self._armed == 0:
                entries = self._entries
                if entries is None:
                    with contextlib.suppress(Exception):
                        self._unregister()
                    return
                for hook, table, key, _, kwargs_table, attributes, tap in entries:
                    if hook._on:
                        hook._on = False
                        if tap is not None and attributes.get("forward") is tap:
                            del attributes["forward"]
                        else:
                            table.pop(key, None)
                            if kwargs_table is not None:
                                kwargs_table.pop(key, None)

    def take_root(self) -> tuple[Callable[[Any], None] | None, Callable[[Any], None] | None]:
        """Hand the model's own input and output hooks to a caller that holds both around
        each forward (the service): it calls the first with the forward's input before it
        and the second with its output after it, inside the sampled scope; the model itself
        then carries no hook, and takes PyTorch's hook-free call path on a sampled forward
        too. Each is None where the model keeps its hook: not watched, or hooks not on
        demand (registered for good), or a mask pre-hook, which must read the forward's
        arguments before the input's hook does."""
        with self._arm_lock:
            if not self.on_demand or self._mask is not None or self._armed:
                return None, None
            takers: list[Callable[[Any], None] | None] = []
            for name in (INPUT_LAYER, OUTPUT_LAYER):
                hook = self._hooks.get(name)
                if hook is not None:
                    hook.unregister()
                    hook.by_caller = True
                takers.append(hook.take if hook is not None else None)
            self._entries = None
            return takers[0], takers[1]

    @property
    def registered(self) -> bool:
        """True while at least one of the hooks is on its module."""
        return any(hook.registered for hook in self._hooks.values())

    def detach(self) -> None:
        with self._arm_lock:
            self._entries = None
            for hook in self._hooks.values():
                hook.remove()
            self._hooks.clear()
            if self._mask is not None:
                self._mask.remove()
                self._mask = None
            self._armed = 0
            self.state = HookState.DETACHED

    def disable(self, layer: str) -> None:
        """Switch one layer off (a fault): on demand, it is no longer registered from the
        next sampled forward on; otherwise it stays registered and returns at once."""
        hook = self._hooks.get(layer)
        if hook is not None and hook.state is HookState.ATTACHED:
            hook.state = HookState.FAULTED
            self._entries = None

    def layer_states(self) -> dict[str, HookState]:
        return {name: hook.state for name, hook in self._hooks.items()}

    def __iter__(self) -> Iterator[LayerHook]:
        return iter(list(self._hooks.values()))

    def __enter__(self) -> HookSet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.detach()
