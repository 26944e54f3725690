"""A JSON payload is decoded as the model takes it: exact integers, and a 4xx for a value the
input's dtype cannot hold (never a silently rounded, wrapped or infinite input)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from hookwatch._config import HandlerConfig, InputSpec
from hookwatch._errors import BadInputError, ConfigError
from hookwatch._metrics import MetricSet
from hookwatch._profile import build_profile
from hookwatch._service import InputPipeline, decode_payload
from tests.unit.test_any_model import monitored, value


def _decode(dtype: str, data: list[Any], **spec: Any) -> torch.Tensor:
    return decode_payload({"data": data}, InputSpec(shape=(3,), dtype=dtype, **spec))


@pytest.mark.parametrize(
    ("dtype", "data"),
    [
        ("int64", [16_777_217, 123_456_789, 2**62 + 1]),  # beyond float32's and float64's digits
        ("int32", [2**31 - 1, -(2**31), 3]),
        ("int64", [3.0, 4, -5]),  # whole floats are whole numbers
        # An int beside a float: numpy reads them all as float64, which rounds 2**53 + 1 and
        # reads 2**63 - 1 as 2**63 (then cast, -2**63).
        ("int64", [0.0, 1, 2**53 + 1]),
        ("int64", [1.0, 2, 2**63 - 1]),
        ("int64", [-(2**63), 2.0, 3]),
        ("bool", [0, 1, 1]),
        ("float64", [0.1, 1e300, -3]),
        ("uint8", [0, 255, 17]),  # raw image bytes
        ("int8", [-128, 127, 0]),
        ("int16", [-32768, 32767, 1]),
    ],
)
def test_values_reach_the_model_exactly(dtype: str, data: list[Any]) -> None:
    tensor = _decode(dtype, data)
    assert tensor.dtype == getattr(torch, dtype)
    assert tensor.tolist() == [type(tensor.tolist()[0])(v) for v in data]
    # The batch keeps them: no float on the way.
    batch = InputPipeline(InputSpec(shape=(3,), dtype=dtype)).batch([tensor, tensor])
    assert batch.dtype == tensor.dtype and torch.equal(batch[1], tensor)


@pytest.mark.parametrize(
    ("dtype", "data", "reason", "said"),
    [
        ("int64", [1e30, -1e30, 3], "out_of_range", "whole numbers in [-9223372036854775808"),
        ("int64", [99_999_999_999_999_999_999, 3, 3], "out_of_range", "got 99999999999999999999"),
        # One past int64's top: numpy read it as the float 2**63, which passed the range check
        # and wrapped to -2**63.
        ("int64", [1, 2, 2**63], "out_of_range", "got 9223372036854775808"),
        ("int64", [1.0, 2, 2**63], "out_of_range", "got 9223372036854775808"),
        ("int64", [1e19, 2, 3], "out_of_range", "whole numbers in [-9223372036854775808"),
        ("int64", [3.5, 3, 3], "wrong_type", "whole numbers"),
        ("int32", [3_000_000_000, 1, 3], "out_of_range", "[-2147483648, 2147483647]"),
        ("bool", [0, 1, 2], "out_of_range", "[0, 1]"),
        ("uint8", [0, 256, 1], "out_of_range", "whole numbers in [0, 255] (input dtype uint8)"),
        ("uint8", [-1, 2, 1], "out_of_range", "[0, 255]"),
        ("int8", [128, 2, 1], "out_of_range", "[-128, 127]"),
        ("float16", [70_000, 1, 0.1], "out_of_range", "within float16's range"),
        ("bfloat16", [1e39, 1, 1], "out_of_range", "within bfloat16's range"),
        ("float64", [10**400, 1, 1], "out_of_range", "within float64's range"),
        ("float32", [1e39, 1, 1], "out_of_range", "within float32's range"),
        ("float32", [float("nan"), 1, 1], "not_finite", "finite numbers"),
        ("float64", [float("inf"), 1, 1], "not_finite", "finite numbers"),
        ("int64", [float("nan"), 1, 1], "not_finite", "finite numbers"),
    ],
)
def test_a_value_the_dtype_cannot_hold_is_a_clear_4xx(
    dtype: str, data: list[Any], reason: str, said: str
) -> None:
    with pytest.raises(BadInputError) as raised:
        _decode(dtype, data)
    assert raised.value.reason == reason
    assert said in str(raised.value)


def test_the_declared_range_still_applies_to_integers() -> None:
    with pytest.raises(BadInputError) as raised:
        _decode("int64", [1, 2, 300], min_value=0, max_value=255)
    assert raised.value.reason == "out_of_range" and "[1, 300]" in str(raised.value)


def _reference(tmp_path: Any, array: Any, dtype: str) -> list[torch.Tensor]:
    import numpy as np

    from hookwatch.tools.own_model import load_reference

    path = tmp_path / "reference.npy"
    np.save(path, np.asarray(array))
    pipeline = InputPipeline(InputSpec(shape=(3,), dtype=dtype))
    return list(load_reference(path, pipeline))


def test_a_reference_array_reaches_the_model_as_requests_do(tmp_path: Any) -> None:
    """A `.npy` reference goes through the same decoding: exact integers, the dtype's range."""
    import numpy as np

    from hookwatch._errors import ConfigError

    ids = np.array([[2**40 + 1, 3, 4], [5, 6, 2**53 + 1]], dtype=np.int64)
    (batch,) = _reference(tmp_path, ids, "int64")
    assert batch.dtype == torch.int64 and batch.tolist() == ids.tolist()
    with pytest.raises(ConfigError, match=r"reference: expected whole numbers in \[-2147483648"):
        _reference(tmp_path, ids, "int32")
    nan = np.ones((4, 3))
    nan[2, 1] = np.nan
    for dtype in ("float32", "int64"):  # an integer input once hid the NaN in its cast
        with pytest.raises(
            ConfigError,
            match=r"expected finite values, got NaN or Infinity in 1 of 4 samples "
            r"\(the first: sample 2\)",
        ):
            _reference(tmp_path, nan, dtype)


def test_a_model_of_raw_image_bytes_is_watched(metrics: MetricSet) -> None:
    class Bytes(nn.Module):
        """Takes uint8 pixels and scales them itself, as an exported pipeline does."""

        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 3)
            self.act = nn.ReLU()
            self.out = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            assert x.dtype == torch.uint8
            return self.out(self.act(self.conv(x.float() / 255)).mean((2, 3)))

    model = Bytes().eval()
    handler = HandlerConfig.from_mapping(
        {
            "input": {"shape": [1, 6, 6], "dtype": "uint8"},
            "monitoring": {"layers": ["act"], "sample_rate": 1.0},
        }
    )
    images = torch.randint(0, 256, (64, 1, 6, 6), dtype=torch.uint8)
    profile = build_profile(model, handler.monitoring, [images[:32], images[32:]], "px")
    service, monitor = monitored(model, handler, profile, "px", metrics)
    answers = service.handle([{"data": images[i].tolist()} for i in range(8)])
    monitor.flush()
    monitor.close()
    assert all("probabilities" in a for a in answers)
    for layer in ("input", "act", "output"):
        assert value(metrics, "hookwatch_captures_total", model="px", layer=layer) == 8
        assert value(metrics, "hookwatch_monitor_faults_total", model="px", layer=layer) == 0


def test_a_batch_of_one_around_the_item_is_the_item_and_more_are_refused_by_count() -> None:
    # Found by an outside run (2026-12-07): clients written for servers that take a batch
    # send [[...]]; that was "nested more than 1 levels".
    spec = InputSpec(shape=(3,))
    assert decode_payload({"data": [[1, 2, 3]]}, spec).tolist() == [1.0, 2.0, 3.0]
    image = InputSpec(shape=(1, 2, 2))
    assert decode_payload({"data": [[[[1, 2], [3, 4]]]]}, image).shape == (1, 2, 2)
    with pytest.raises(BadInputError) as raised:
        decode_payload({"data": [[1, 2, 3], [4, 5, 6]]}, spec)
    assert raised.value.expected == "one item of shape [3] a request (TorchServe batches requests)"
    assert raised.value.got == "2 items (shape [2, 3])"
    # Deeper, or not the item's shape inside: what it always was.
    for data in ([[[1, 2, 3]]], [[1, 2]]):
        with pytest.raises(BadInputError, match="nested 1 levels deep"):
            decode_payload({"data": data}, spec)
    series = InputSpec(shape=(4, 2), length_dim=0)
    assert decode_payload({"data": [[[1, 2], [3, 4], [5, 6]]]}, series).shape == (3, 2)
    with pytest.raises(BadInputError, match="2 items"):
        decode_payload({"data": [[[1, 2]], [[3, 4]]]}, series)


def test_a_bool_input_takes_json_true_and_false_and_others_do_not() -> None:
    # A mask sent as JSON booleans was "a ragged or non-numeric list".
    assert _decode("bool", [True, False, True]).tolist() == [True, False, True]
    with pytest.raises(BadInputError, match="rectangular array of numbers"):
        _decode("float32", [True, False, True])


def test_the_input_is_found_where_other_serving_apis_put_it() -> None:
    """A bare array, or (with the default field) KServe's and TF Serving's ``instances`` or
    ``inputs``: the clients of those servers send these, and got a 400."""
    spec = InputSpec(shape=(3,))
    for body in ([1, 2, 3], {"instances": [[1, 2, 3]]}, {"inputs": [1, 2, 3]}):
        assert decode_payload(body, spec).tolist() == [1.0, 2.0, 3.0]
    refused = {
        "2 items": {"instances": [[1, 2, 3], [4, 5, 6]]},  # TorchServe batches requests
        "keys \\[inputs, instances\\]": {"instances": [[1, 2, 3]], "inputs": [1, 2, 3]},
        "null": {"data": None},
    }
    for got, body in refused.items():
        with pytest.raises(BadInputError, match=got):
            decode_payload(body, spec)
    # A field of the config's own naming is the one place looked.
    with pytest.raises(BadInputError, match='"pixels"'):
        decode_payload({"inputs": [1, 2, 3]}, InputSpec(shape=(3,), field="pixels"))
    assert decode_payload({"pixels": [1, 2, 3]}, InputSpec(shape=(3,), field="pixels")).numel()


@pytest.mark.parametrize(
    ("data", "got"),
    [
        # A missing value sent as JSON null: where it is, not "a ragged or non-numeric list".
        ([0.5, None, 2], "a list holding null at [1]"),
        ([[1, 2], [3, "4"]], "a list holding str '4' at [1][1]"),
        ([[1, 2], [3, 4, 5]], "a ragged list: 2 items at [0], 3 items at [1]"),
        ([[1, 2], 3], "a ragged list: 2 items at [0], a number at [1]"),
        ([[1, 2], []], "a list holding an empty list at [1]"),
        ([[1, 2], {"x": 1}], "a list holding an object with keys [x] at [1]"),
        ([True, 1, 0, 1], "a list holding true at [0]"),
    ],
)
def test_a_refused_list_says_what_and_where(data: list[Any], got: str) -> None:
    spec = InputSpec(shape=(2, 2))
    with pytest.raises(BadInputError) as raised:
        decode_payload({"data": data}, spec)
    assert raised.value.got == got
    assert raised.value.expected.startswith("a rectangular array of numbers of shape [2, 2]")


def test_a_reference_npy_is_read_a_batch_at_a_time(tmp_path: Any) -> None:
    """A uint8 image array for a float32 input was converted whole (four times the file's
    size in memory at once, after reading it whole); the .npy is mapped and each batch
    converted as it is used, to the same values. Its checks still see every sample."""
    import numpy as np

    from hookwatch.tools.arrays import read_arrays
    from hookwatch.tools.own_model import load_reference

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(300, 3), dtype=np.uint8)
    path = tmp_path / "pixels.npy"
    np.save(path, pixels)
    assert isinstance(read_arrays(path, "reference"), np.memmap)
    pipeline = InputPipeline(InputSpec(shape=(3,), min_value=0, max_value=255))
    batches = list(load_reference(path, pipeline, batch_size=64))
    assert [len(b) for b in batches] == [64, 64, 64, 64, 44]
    joined = torch.cat(batches)
    assert joined.dtype == torch.float32 and torch.equal(joined, torch.from_numpy(pixels).float())
    narrow = InputPipeline(InputSpec(shape=(3,), min_value=0, max_value=200))
    with pytest.raises(ConfigError, match=r"expected values in \[0, 200\].*got \[0, 255\]"):
        list(load_reference(path, narrow))
    late = rng.normal(size=(9000, 3))
    late[[5000, 8999], 1] = np.inf  # past the first slice checked
    np.save(path, late)
    with pytest.raises(ConfigError, match=r"in 2 of 9000 samples \(the first: sample 5000\)"):
        list(load_reference(path, InputPipeline(InputSpec(shape=(3,)))))


def test_a_request_of_several_items_is_answered_whole_when_its_batch_runs_alone() -> None:
    """A forward that raises on one request's item reruns each request alone: the request of
    several items is answered its list (under instances, its predictions), the other a 422."""
    from hookwatch._service import ModelService

    class Picky(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if bool((x > 50).any()):
                raise ValueError("values over 50 are refused")
            out: torch.Tensor = self.fc(x)
            return out

    torch.manual_seed(0)
    service = ModelService(Picky().eval(), InputSpec(shape=(3,)), None)
    rows = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    alone = [service.handle([{"data": row}])[0] for row in rows]
    answers = service.handle([{"instances": rows}, {"data": [99.0, 0.0, 0.0]}, {"data": rows}])
    assert answers[0] == {"predictions": alone} and answers[2] == alone
    assert answers[1]["code"] == 422 and "values over 50" in answers[1]["got"]


@pytest.mark.parametrize(
    ("body", "got"),
    [
        ({"instances": [[[0.0] * 3] * 4, [[0.0] * 3] * 3]}, "shape [3, 3] in item 1"),
        ({"instances": [[[0.0] * 3] * 3]}, "shape [3, 3] in item 0"),
        ({"data": [[[0.0] * 3] * 4, "x"]}, "str 'x' in item 1"),
    ],
)
def test_a_bad_item_among_several_is_named_with_what_is_wrong(body: Any, got: str) -> None:
    # Each was "expected an array nested 2 levels deep, got one nested more than 2 levels"
    # (too_deep), naming neither the item nor the fault (an outside run, 2026-12-07).
    with pytest.raises(BadInputError) as raised:
        decode_payload(body, InputSpec(shape=(4, 3)), several=True)
    assert raised.value.reason == "wrong_shape" and raised.value.got.endswith(got), raised.value


def test_a_float64_model_is_answered_with_its_digits() -> None:
    # Answers went through float32: 121961039.97789869 came back 121961040.0 (an outside
    # run's float64 regression model, 2026-12-07), and the protocol's output said FP32.
    from hookwatch._service import ModelService

    model = nn.Linear(2, 2).double()
    with torch.no_grad():
        model.weight.fill_(1e8 / 3)
        model.bias.zero_()
    handler = HandlerConfig.from_mapping(
        {
            "input": {"shape": [2], "dtype": "float64"},
            "monitoring": {"layers": [], "output": {"head": "values"}},
        }
    )
    service = ModelService(model, handler.input, None, output=handler.monitoring.output)
    x = [0.1234567891, 1.5]
    expected = model(torch.tensor([x], dtype=torch.float64))[0].tolist()
    (answer,) = service.handle([{"data": x}])
    assert answer["values"] == expected
    tensor = {"name": "x", "shape": [1, 2], "datatype": "FP64", "data": x}
    (v2,) = service.handle([{"inputs": [tensor]}])
    (output,) = v2["outputs"]
    assert output["datatype"] == "FP64" and output["data"] == expected


def test_an_npy_array_of_another_shape_says_its_shape() -> None:
    # A [2, 3] array to a [4] input read "nested more than 1 levels" (too_deep), unlike the
    # same rows as JSON (an outside run, 2026-12-07).
    import io

    import numpy as np

    def npy(array: Any) -> bytes:
        out = io.BytesIO()
        np.save(out, array)
        return out.getvalue()

    spec = InputSpec(shape=(4,))
    for array in (np.ones((2, 3)), np.ones((0, 4)), np.ones((2, 2))):
        with pytest.raises(BadInputError) as raised:
            decode_payload(npy(array), spec, several=True)
        assert raised.value.reason == "wrong_shape"
        assert raised.value.got == f"an array of shape {list(array.shape)}", raised.value
    assert decode_payload(npy(np.ones((1, 4))), spec, several=True).shape == (4,)
    # An input of a length each request chooses: its shape too.
    ids = InputSpec.from_mapping({"shape": [None], "max_length": 30, "dtype": "int64"})
    with pytest.raises(BadInputError) as raised:
        decode_payload(npy(np.zeros((2, 3, 4), np.int64)), ids, several=True)
    assert raised.value.got == "an array of shape [2, 3, 4]", raised.value
