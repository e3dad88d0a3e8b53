"""Federated learning with privacy built in, for your own training code.

``Client(server, ...).run(train, num_examples)`` joins an ``fl-server`` and trains until the server
ends training. ``train(weights, config)`` receives the global model as a flat float32 array and
returns the new one; everything else (the protocol, TLS and enrollment, reconnection, clipping,
local DP noise, SignDS, secure-aggregation masks) is done by the same Rust code as the
``fl-client`` binary.

``flatten`` and ``unflatten`` turn a PyTorch ``state_dict`` (or any mapping of arrays) into that
flat vector and back, in the order of the tensors' names.
"""

from ._core import Client, ClientError, ServerError, __version__
from .tensors import flatten, tensor_order, unflatten

__all__ = [
    "Client",
    "ClientError",
    "ServerError",
    "__version__",
    "flatten",
    "tensor_order",
    "unflatten",
]
