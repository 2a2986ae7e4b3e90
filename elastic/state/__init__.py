"""Elastic training state: what workers commit, restore after a failure and sync to joiners."""

from elastic.state.sampler import ElasticSampler
from elastic.state.state import ObjectState, State
from elastic.state.torch_state import TorchState

__all__ = ["ElasticSampler", "ObjectState", "State", "TorchState"]
