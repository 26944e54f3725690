"""Forward hooks registered once on the watched layers and gated on every call.

A hook does three things on the request path: read the gate, take an owned copy of a small
activation or run the cheap reduction of a large one, and hand the result to a sink that never
blocks. It never raises into the model's forward
and never stores the activation; a fault disables that one layer and is reported through the
sink's ``on_fault``.
"""

from __future__ import annotations

import contextlib
import difflib
import enum
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, NamedTuple, Protocol

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from hookwatch._errors import ConfigError
from hookwatch._names import INPUT_LAYER, OUTPUT_LAYER
from hookwatch._stats import feature_summary, reduce_activation


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
    hook call, it costs a tenth as much.
    """

    layer: str
    stats: torch.Tensor | None
    features: torch.Tensor | None
    raw: torch.Tensor | None = None


class CaptureSink(Protocol):
    def offer(self, capture: Capture) -> bool:
        """Take ``capture`` without blocking; return False if it was dropped."""

    def on_fault(self, layer: str, error: BaseException) -> None:
        """Called once when a layer's hook fails and is switched off."""


class Gate(threading.local):
    """The per-request sampling decision that every hook reads.

    TorchServe runs one request batch at a time per worker, but a thread-local keeps the gate
    correct if a model is ever driven from several threads. ``open`` is a plain attribute of
    the thread-local (the class value is the default on a new thread): every hook call of every
    request reads it, and a property would double the cost of a closed gate.
    """

    open: bool = False

    def set(self, value: bool) -> None:
        self.open = value


def resolve_layer(model: nn.Module, path: str) -> nn.Module:
    """Find a dotted ``named_modules()`` path; unknown paths fail with the closest matches."""
    modules = dict(model.named_modules())
    if path in modules and path != "":
        found: nn.Module = modules[path]
        return found
    names = [n for n in modules if n]
    close = difflib.get_close_matches(path, names, n=5, cutoff=0.5)
    hint = f"; close matches: {', '.join(close)}" if close else ""
    sample = ", ".join(names[:12]) + (" ..." if len(names) > 12 else "")
    raise ConfigError(
        f"monitoring.layers: expected a module path of the model, got {path!r}{hint} "
        f"(the model has: {sample})"
    )


class LayerHook:
    """One registered hook on one module: the unit that can be faulted and removed."""

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
    ) -> None:
        self.name = name
        self._copy_limit = copy_limit
        self._module_ref: weakref.ReferenceType[nn.Module] = weakref.ref(module)
        self._gate = gate
        self._sink = sink
        # A projected layer keeps its projection's input width instead of the budget.
        self._max_features = max_features if width is None else width
        self._flatten = on_input
        self._handle: RemovableHandle | None
        self.state = HookState.ATTACHED
        if on_input:
            self._handle = module.register_forward_pre_hook(self._pre_hook)
        else:
            self._handle = module.register_forward_hook(self._hook)

    # The gate first: it is closed on most calls, and reading it is the cheaper test.
    def _pre_hook(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if self._gate.open and self.state is HookState.ATTACHED:
            self._capture(args[0] if args else None)

    def _hook(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self._gate.open and self.state is HookState.ATTACHED:
            self._capture(output)

    def _capture(self, value: Any) -> None:
        try:
            tensor = value if type(value) is torch.Tensor else _first_tensor(value)
            if tensor is None:
                raise TypeError(f"expected a tensor output, got {type(value).__name__}")
            rows = len(tensor.shape) and tensor.shape[0]
            # From sizes alone: indexing a sample would be one more torch call per hook.
            per_sample = tensor.numel() // rows if rows else tensor.numel()
            if tensor.dim() and per_sample <= self._copy_limit:
                # Under inference_mode/no_grad (serving) nothing needs detaching before the copy.
                raw = (tensor.detach() if tensor.requires_grad else tensor).clone()
                capture = Capture(self.name, None, None, raw)
            else:
                capture = Capture(
                    layer=self.name,
                    stats=reduce_activation(tensor),
                    features=feature_summary(tensor, self._max_features, self._flatten),
                )
            self._sink.offer(capture)
        except Exception as error:  # a monitor must never fail the request
            self.state = HookState.FAULTED
            with contextlib.suppress(Exception):
                self._sink.on_fault(self.name, error)

    @property
    def module(self) -> nn.Module | None:
        return self._module_ref()

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self.state = HookState.DETACHED


def _first_tensor(value: Any) -> torch.Tensor | None:
    """The tensor to watch in an output: itself, or the first tensor of a tuple/list/dict."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, list | tuple):
        for item in value:
            if isinstance(item, torch.Tensor):
                return item
    if isinstance(value, dict):
        for item in value.values():
            if isinstance(item, torch.Tensor):
                return item
    return None


class HookSet:
    """All hooks of one model: ``attach()`` once, ``detach()`` any number of times.

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
        self.state = HookState.DETACHED

    def attach(
        self,
        model: nn.Module,
        layers: Sequence[str],
        capture_input: bool = True,
        capture_output: bool = True,
        widths: Mapping[str, int] | None = None,
    ) -> HookSet:
        """Register the hooks; ``widths`` overrides ``max_features`` per layer (projected ones)."""
        if self.state is not HookState.DETACHED:
            raise RuntimeError(f"expected a detached HookSet, got state {self.state.value}")
        # Resolve every path before registering anything, so a typo leaves the model untouched.
        targets = [(name, resolve_layer(model, name)) for name in layers]
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
            )
        self.state = HookState.ATTACHED
        return self

    def detach(self) -> None:
        for hook in self._hooks.values():
            hook.remove()
        self._hooks.clear()
        self.state = HookState.DETACHED

    def disable(self, layer: str) -> None:
        hook = self._hooks.get(layer)
        if hook is not None and hook.state is HookState.ATTACHED:
            hook.state = HookState.FAULTED

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
