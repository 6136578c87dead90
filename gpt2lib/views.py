"""A view of a model: new module objects over the same parameters, buffers and hooks.

Hand-written. `model_view(model)` lets an entry point add hooks (`gpt2lib.inspection`) or swap
a module for a faster one (`gpt2lib.speed`) without changing the caller's model, even while
another thread runs it: the view's modules are shallow copies, so they share every parameter,
buffer and the hooks registered so far, but hooks registered on the view, and a view module's
class, stay on the view.
"""

from __future__ import annotations

import copy

import torch.nn as nn

__all__ = ["model_view"]


def model_view(model: nn.Module) -> nn.Module:
    """A shallow copy of `model` and of every module inside it (a module shared by two parents
    stays shared); parameters and buffers are the same tensors, and the hooks registered on
    `model` so far apply to the view too."""
    return _view(model, {})


def _view(module: nn.Module, done: dict[int, nn.Module]) -> nn.Module:
    if id(module) in done:
        return done[id(module)]
    twin = copy.copy(module)
    done[id(module)] = twin
    for name, value in vars(module).items():
        # the registries (hooks, parameters, buffers): a copy of each, so that what is
        # registered on the view does not reach the model
        if name.startswith("_") and isinstance(value, (dict, set)):
            twin.__dict__[name] = copy.copy(value)
    twin._modules = {
        name: None if child is None else _view(child, done)
        for name, child in module._modules.items()
    }
    return twin
