"""A model's named tensors as one flat float32 vector and back, without depending on a framework.

The order is the byte order of the tensors' names (``sorted`` of UTF-8 names): the order in which
``safetensors`` writes a file's tensors of one dtype, and the order the server uses for a model it
does not know. Any mapping of names to arrays works: a PyTorch ``state_dict`` (tensors are read
with ``.detach().cpu().numpy()``), a dict of numpy arrays, JAX arrays.

Only floating-point tensors travel. Integer and boolean buffers (BatchNorm's
``num_batches_tracked``) are not parameters: ``flatten`` leaves them out and ``unflatten`` returns
the client's own, so they never leave it (as FedBN keeps local statistics), and the server leaves
them out of ``model.init``.
"""

from collections.abc import Mapping

import numpy as np


def tensor_order(tensors: Mapping) -> list:
    """The names of the floating-point tensors of ``tensors``, in the flat vector's order."""
    floats = [name for name in tensors if _is_float(tensors[name])]
    return sorted(floats, key=lambda name: name.encode("utf-8"))


def _is_float(value) -> bool:
    dtype = getattr(value, "dtype", None)
    if dtype is not None and hasattr(dtype, "is_floating_point"):  # a torch.dtype
        return bool(dtype.is_floating_point)
    return np.issubdtype(_as_numpy(value).dtype, np.floating)


def _as_numpy(value) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch.Tensor, without importing torch
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def flatten(tensors: Mapping) -> np.ndarray:
    """The values of ``tensors`` as one flat float32 vector, tensor after tensor in name order,
    each in row-major (C) order."""
    parts = [_as_numpy(tensors[name]).astype(np.float32).ravel() for name in tensor_order(tensors)]
    if not parts:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate(parts)


def unflatten(vector, like: Mapping) -> dict:
    """Splits ``vector`` into tensors named and shaped as the floating-point ones of ``like`` (a
    ``state_dict`` or a mapping of arrays): the inverse of ``flatten``. ``like``'s integer and
    boolean buffers come back as they are in ``like``. Returns numpy arrays; for PyTorch, load
    them with ``model.load_state_dict({k: torch.from_numpy(v) for k, v in out.items()})``."""
    vector = np.asarray(vector, dtype=np.float32).ravel()
    out = {name: _as_numpy(value).copy() for name, value in like.items() if not _is_float(value)}
    offset = 0
    for name in tensor_order(like):
        shape = tuple(_as_numpy(like[name]).shape)
        size = int(np.prod(shape, dtype=np.int64))
        if offset + size > vector.size:
            raise ValueError(f"the vector has {vector.size} values, fewer than the tensors need")
        out[name] = vector[offset : offset + size].reshape(shape).copy()
        offset += size
    if offset != vector.size:
        raise ValueError(f"the vector has {vector.size} values, the tensors {offset}")
    return out
