"""Both hook states implement :class:`compression.WorkerState` whole: a member one of them left
out would be inherited from the Protocol's stub and answer None without a word."""

from __future__ import annotations

import pytest
from torch import nn

import compression
from compression.comm import SimComm
from compression.hook import HookState
from compression.worker import WorkerState
from training.simulated import AllWorkers, WorkerRNG

METHODS = sorted(name for name, value in vars(WorkerState).items()
                 if callable(value) and not name.startswith("_"))
ATTRIBUTES = sorted(WorkerState.__annotations__)


def states() -> dict[str, WorkerState]:
    """One DDP rank's hook state and two simulated learners', over a small model."""
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    compressor = compression.create("topk", ratio=0.5)
    learners = [HookState(compressor, model.named_parameters(), comm=comm)
                for comm in SimComm.group(2)]
    return {"HookState": learners[0], "AllWorkers": AllWorkers(learners, WorkerRNG([0, 1]))}


def test_the_protocol_names_what_the_loop_the_schedulers_and_the_checkpoint_use():
    assert METHODS == ["add_probe", "compressed_layers", "epoch_state_dict", "epoch_stats",
                       "grad_norms", "load_epoch_state_dict", "nonfinite", "reset_epoch",
                       "set_levels"]
    assert ATTRIBUTES == ["compressor", "layers"]


@pytest.mark.parametrize("cls", [HookState, AllWorkers])
def test_each_hook_state_defines_every_method_of_the_protocol(cls):
    assert WorkerState in cls.__mro__  # explicitly (issubclass refuses a plain Protocol)
    inherited = [name for name in METHODS if getattr(cls, name) is getattr(WorkerState, name)]
    assert not inherited, f"{cls.__name__} leaves {inherited} to the Protocol's stubs"


@pytest.mark.parametrize("kind", ["HookState", "AllWorkers"])
def test_each_hook_state_has_the_protocols_attributes(kind):
    state = states()[kind]
    missing = [name for name in ATTRIBUTES if not hasattr(state, name)]
    assert not missing, f"{kind} has no {missing}"
    assert state.compressor.name == "topk"
    assert list(state.layers) == ["0.weight", "0.bias", "2.weight", "2.bias"]
