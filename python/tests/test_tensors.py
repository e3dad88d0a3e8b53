"""flatten and unflatten: a mapping of named arrays to one flat float32 vector and back."""

import numpy as np
import pytest

from fl_client import flatten, tensor_order, unflatten


def state():
    return {
        "layers.10.weight": np.arange(6, dtype=np.float64).reshape(2, 3),
        "layers.2.bias": np.array([7.0, 8.0], dtype=np.float32),
        "layers.2.weight": np.arange(4, dtype=np.float32).reshape(2, 2) + 10,
    }


def test_the_order_is_the_names_byte_order_whatever_the_mapping_order():
    s = state()
    backwards = dict(reversed(list(s.items())))
    assert tensor_order(s) == ["layers.10.weight", "layers.2.bias", "layers.2.weight"]
    v = flatten(backwards)
    assert v.dtype == np.float32
    assert v.tolist() == [0, 1, 2, 3, 4, 5, 7, 8, 10, 11, 12, 13]


def test_unflatten_inverts_flatten_with_the_shapes_of_the_template():
    s = state()
    out = unflatten(flatten(s) * 2, s)
    assert list(out) == tensor_order(s)
    for name, value in s.items():
        assert out[name].shape == value.shape
        np.testing.assert_array_equal(out[name], value * 2)


def test_integer_buffers_stay_with_the_client():
    s = state()
    s["bn.num_batches_tracked"] = np.array(7, dtype=np.int64)
    v = flatten(s)
    assert v.size == 12
    out = unflatten(v * 2, s)
    assert out["bn.num_batches_tracked"].dtype == np.int64
    assert int(out["bn.num_batches_tracked"]) == 7
    np.testing.assert_array_equal(out["layers.2.bias"], s["layers.2.bias"] * 2)


def test_a_vector_of_the_wrong_length_is_refused():
    s = state()
    with pytest.raises(ValueError, match="fewer"):
        unflatten(np.zeros(11), s)
    with pytest.raises(ValueError, match="13 values, the tensors 12"):
        unflatten(np.zeros(13), s)


class FakeTensor:
    """Stands for a torch.Tensor: flatten reads it through detach().cpu().numpy()."""

    def __init__(self, a):
        self.a = a

    def detach(self):
        return self

    def cpu(self):
        return self

    def numpy(self):
        return self.a


def test_tensors_of_a_framework_are_read_through_numpy():
    s = {"b": FakeTensor(np.ones(2)), "a": FakeTensor(np.zeros((1, 2)))}
    assert flatten(s).tolist() == [0, 0, 1, 1]
    assert unflatten(np.arange(4), s)["a"].shape == (1, 2)
