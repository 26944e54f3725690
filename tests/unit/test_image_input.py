"""``input.encoding: image``: image files as requests (a raw body, a multipart field, base64 in
the JSON field) and as the reference (a directory), decoded alike: oriented, converted to the
shape's channels, scaled to cover it with the aspect kept, centre-cropped, pixels over 255."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from hookwatch._body import IMAGE_BODY_BYTES, MAX_BODY_BYTES, body_limit
from hookwatch._config import InputSpec
from hookwatch._errors import BadInputError, ConfigError
from hookwatch._names import REJECT_REASONS
from hookwatch._service import InputPipeline, Items
from hookwatch.tools.own_model import ModelRef, archive_model, load_reference
from tests.fakes import archived_handler, handled


def _file(array: np.ndarray, fmt: str = "PNG", **save: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, fmt, **save)
    return out.getvalue()


def _pipeline(shape: list[int], **more: object) -> InputPipeline:
    return InputPipeline(InputSpec.from_mapping({"shape": shape, "encoding": "image", **more}))


#: Smooth colours (lossy formats keep them close) of distinct values in each channel.
_ROWS, _COLUMNS = np.mgrid[0:24, 0:40]
RGB = np.dstack([_ROWS * 10, _COLUMNS * 6, 255 - _ROWS * 5 - _COLUMNS * 3]).astype(np.uint8)


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "TIFF", "WEBP", "JPEG", "GIF"])
def test_each_format_decodes_to_the_shape_as_pixels_over_255(fmt: str) -> None:
    lossless = fmt in ("PNG", "BMP", "TIFF")
    data = _file(RGB, fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    x = _pipeline([3, 24, 40]).decode(data)
    assert x.shape == (3, 24, 40) and x.dtype == torch.float32
    expected = torch.from_numpy(RGB).permute(2, 0, 1).float() / 255
    if lossless or fmt == "WEBP":
        assert torch.equal(x, expected)
    else:  # lossy, or a 256-colour palette: close, not equal
        assert float((x - expected).abs().mean()) < 0.03


def test_aspect_kept_then_the_centre_cropped() -> None:
    # 4 rows x 8 columns to 4x4: no scaling needed, columns 2-5 kept.
    grey = np.arange(32, dtype=np.uint8).reshape(4, 8)
    x = _pipeline([1, 4, 4], dtype="uint8").decode(_file(grey))
    assert x.dtype == torch.uint8
    assert torch.equal(x[0], torch.from_numpy(grey[:, 2:6]))
    # A wide image scaled down until its height fits (8x16 -> 4x8), then cropped: a left half
    # of 0s and a right half of 200s gives 0s then 200s in the centre's columns.
    halves = np.zeros((8, 16), dtype=np.uint8)
    halves[:, 8:] = 200
    y = _pipeline([1, 4, 4], dtype="uint8").decode(_file(halves))
    assert int(y[0, :, 0].max()) == 0 and int(y[0, :, 3].min()) == 200
    # A small image is scaled up to cover the input.
    z = _pipeline([3, 64, 64]).decode(_file(RGB))
    assert z.shape == (3, 64, 64)


def test_a_photo_is_turned_by_its_exif_orientation() -> None:
    tall = np.zeros((8, 4), dtype=np.uint8)
    tall[:4] = 255  # top half white
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: displayed turned 90 degrees clockwise
    data = _file(tall, "PNG", exif=exif.tobytes())
    x = _pipeline([1, 4, 8], dtype="uint8").decode(data)
    # Displayed 4 rows x 8 columns, the white half on the right.
    assert int(x[0, :, 4:].min()) == 255 and int(x[0, :, :4].max()) == 0


def test_channels_are_converted_to_the_shapes() -> None:
    grey = np.full((6, 6), 51, dtype=np.uint8)
    rgb = _pipeline([3, 6, 6]).decode(_file(grey))
    assert rgb.shape == (3, 6, 6) and torch.allclose(rgb, torch.full((3, 6, 6), 0.2))
    rgba = np.dstack([RGB, np.full(RGB.shape[:2], 128, np.uint8)])
    assert _pipeline([3, 24, 40]).decode(_file(rgba)).shape == (3, 24, 40)
    assert _pipeline([4, 24, 40]).decode(_file(rgba)).shape == (4, 24, 40)
    assert _pipeline([1, 24, 40]).decode(_file(RGB)).shape == (1, 24, 40)


def test_base64_in_the_json_field_and_numbers_are_taken_too() -> None:
    pipeline = _pipeline([3, 24, 40], field="image")
    data = _file(RGB)
    encoded = base64.b64encode(data).decode()
    raw = pipeline.decode(data)
    assert torch.equal(pipeline.decode({"image": encoded}), raw)
    assert torch.equal(pipeline.decode({"image": "data:image/png;base64," + encoded}), raw)
    assert torch.equal(pipeline.decode({"image": raw.tolist()}), raw)
    # JSON sent without its Content-Type arrives as bytes: read as JSON, not as an image.
    assert torch.equal(pipeline.decode(f'{{"image": "{encoded}"}}'.encode()), raw)
    # As TF Serving's and KServe's clients send binary data: {"b64": ...}, in `instances`
    # of one (each a 400 "an object with keys [b64]" or "a list of 1 items" before).
    assert torch.equal(pipeline.decode({"image": {"b64": encoded}}), raw)
    # Under `instances` the request is their protocol's batch (answered {"predictions": ...}).
    default = _pipeline([3, 24, 40])
    for body in ({"instances": [{"b64": encoded}]}, {"instances": [encoded]}):
        batch = default.decode(body)
        assert isinstance(batch, Items) and batch.wrapped and torch.equal(batch.rows, raw[None])
    two = default.decode({"instances": [{"b64": encoded}, encoded]})
    assert isinstance(two, Items) and torch.equal(two.rows, torch.stack([raw, raw]))
    with pytest.raises(BadInputError, match="not base64"):
        default.decode({"instances": [{"b64": "**"}]})
    # Among several, the bad one is named.
    with pytest.raises(BadInputError, match="not base64 in item 2"):
        default.decode({"instances": [encoded, encoded, "abc"]})


@pytest.mark.parametrize(
    ("body", "reason", "got"),
    [
        (b"GIF89a not really", "not_json", "not one"),
        (b"plain text, not a picture", "not_json", "not one"),
        ({"data": "**not base64**"}, "not_json", "not base64"),
        ({"data": base64.b64encode(b"abc").decode()}, "not_json", "not one"),
        ({"other": 1}, "missing_field", "keys [other]"),
    ],
)
def test_what_is_not_an_image_is_a_400_saying_so(body: object, reason: str, got: str) -> None:
    with pytest.raises(BadInputError) as caught:
        _pipeline([3, 8, 8]).decode(body)
    assert caught.value.reason == reason and got in str(caught.value), str(caught.value)
    assert "image" in str(caught.value)


def test_a_truncated_file_is_a_400_and_a_huge_one_a_413() -> None:
    data = _file(RGB, "PNG")
    with pytest.raises(BadInputError) as truncated:
        _pipeline([3, 8, 8]).decode(data[: len(data) // 2])
    assert truncated.value.reason == "not_json" and "does not decode" in str(truncated.value)
    # Fifty-six megapixels in a few kilobytes: refused before they are decoded.
    out = io.BytesIO()
    Image.new("1", (8000, 7000)).save(out, "PNG")
    assert len(out.getvalue()) < 100_000
    with pytest.raises(BadInputError) as huge:
        _pipeline([3, 8, 8]).decode(out.getvalue())
    assert huge.value.reason == "too_large" and "8000x7000" in str(huge.value)
    assert huge.value.status == 413  # as security.md's table says (it was a 400)
    # Past twice the limit Pillow itself refuses at open: a 413 too.
    out = io.BytesIO()
    Image.new("1", (15000, 12000)).save(out, "PNG")
    with pytest.raises(BadInputError) as bomb:
        _pipeline([3, 8, 8]).decode(out.getvalue())
    assert (bomb.value.reason, bomb.value.status) == ("too_large", 413), str(bomb.value)


def test_a_16_bit_image_is_read_at_its_range_not_clipped() -> None:
    # Pillow's own conversion of a 16-bit grey image clips at 255: a scan of values up to
    # 65535 reached the model almost all white, its answer confidently wrong.
    grey = (np.arange(24 * 40).reshape(24, 40) % 256).astype(np.uint8)
    wide = grey.astype(np.uint16) * 257
    data = _file(wide, "PNG")
    assert Image.open(io.BytesIO(data)).mode.startswith("I;16")
    for shape in ([1, 24, 40], [3, 24, 40]):
        assert torch.equal(_pipeline(shape).decode(data), _pipeline(shape).decode(_file(grey)))


def test_base64_wrapped_in_lines_and_a_data_url_without_its_comma() -> None:
    pipeline = _pipeline([3, 24, 40])
    data = _file(RGB)
    wrapped = base64.encodebytes(data).decode()  # 76 columns, as MIME and `base64` write it
    assert "\n" in wrapped
    assert torch.equal(pipeline.decode({"data": wrapped}), pipeline.decode(data))
    for url, got in (
        ("data:image/png;base64", "without a comma"),
        ("data:image/png," + base64.b64encode(data).decode(), "header is 'data:image/png'"),
    ):
        with pytest.raises(BadInputError) as caught:
            pipeline.decode({"data": url})
        assert caught.value.reason == "not_json" and got in str(caught.value), str(caught.value)


def test_the_body_limit_takes_a_photo() -> None:
    assert body_limit(3 * 8 * 8) == MAX_BODY_BYTES
    assert body_limit(3 * 8 * 8, image=True) == IMAGE_BODY_BYTES
    assert body_limit(3 * 8 * 8, 5000, image=True) == 5000


@pytest.mark.parametrize(
    ("more", "message"),
    [
        ({"shape": [24, 40]}, r"\[channels, height, width\]"),
        ({"shape": [2, 24, 40]}, r"1 \(grey\), 3 \(RGB\) or 4 \(RGBA\) channels, got \[2, 24"),
        ({"dtype": "int64"}, "expected input.dtype one of"),
        ({"preprocess": "prep:fn"}, "got input.preprocess too"),
    ],
)
def test_the_config_refuses_what_an_image_cannot_be(more: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        InputSpec.from_mapping({"shape": [3, 24, 40], "encoding": "image", **more})


def test_a_reference_directory_is_decoded_as_requests_are(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    files = {}
    for name in ("b/2.png", "a/1.jpg", "a/0.png", "c.webp"):
        path = tmp_path / "images" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _file(
            rng.integers(0, 256, (30, 30, 3), dtype=np.uint8),
            "JPEG" if name.endswith("jpg") else ("WEBP" if name.endswith("webp") else "PNG"),
        )
        path.write_bytes(data)
        files[name] = data
    (tmp_path / "images" / "notes.txt").write_text("not an image: skipped")
    pipeline = _pipeline([3, 16, 16], mean=[0.5], std=[0.25])
    (batch,) = load_reference(tmp_path / "images", pipeline)
    order = ["a/0.png", "a/1.jpg", "b/2.png", "c.webp"]  # sorted paths: the labels' order
    expected = pipeline.batch([pipeline.decode(files[name]) for name in order])
    assert isinstance(batch, torch.Tensor) and torch.equal(batch, expected)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="expected image files"):
        list(load_reference(tmp_path / "empty", pipeline))
    with pytest.raises(ConfigError, match="a directory holds images"):
        list(load_reference(tmp_path / "images", InputPipeline(InputSpec(shape=(3, 16, 16)))))
    (tmp_path / "images" / "broken.png").write_bytes(b"\x89PNG broken")
    with pytest.raises(ConfigError, match=r"broken.png: expected an image file"):
        list(load_reference(tmp_path / "images", pipeline))


CNN = (
    "import torch\nfrom torch import nn\n\n"
    "class Tiny(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        torch.manual_seed(0)\n"
    "        self.conv = nn.Conv2d(3, 4, 3)\n"
    "        self.act = nn.ReLU()\n"
    "        self.out = nn.Linear(4, 3)\n\n"
    "    def forward(self, x):\n"
    "        return self.out(self.act(self.conv(x)).mean((2, 3)))\n"
)


def test_archived_from_a_directory_of_images_and_served_image_bodies(tmp_path: Path) -> None:
    (tmp_path / "tiny.py").write_text(CNN)
    rng = np.random.default_rng(2)
    for i in range(80):
        path = tmp_path / "ref" / "ab"[i % 2] / f"{i:03}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_file(rng.integers(0, 256, (20, 28, 3), dtype=np.uint8)))
    config = tmp_path / "tiny.yaml"  # any name: `serve` reads it by the manifest's
    handler = {
        "input": {"shape": [3, 16, 16], "encoding": "image", "mean": [0.5], "std": [0.25]},
        "monitoring": {"layers": ["act"], "output": {"head": "logits"}, "sample_rate": 1.0},
    }
    config.write_text(yaml.safe_dump({"handler": handler}))
    said: list[str] = []
    mar = archive_model(
        ModelRef.parse(f"{tmp_path / 'tiny.py'}:Tiny"),
        "tiny",
        config,
        tmp_path / "ref",
        tmp_path / "store",
        tmp_path / "build",
        say=said.append,
    )
    # Images in folders that name no class: unlabelled, and told how folders would label.
    assert any("images are in folders (a, b)" in line for line in said), said
    # `hookwatch serve` raises TorchServe's body limit to the photo-sized one (it read the
    # config as model-config.yaml only, and kept TorchServe's 6.5 MB for any other name).
    from hookwatch.tools.devstack import _body_limit

    assert _body_limit(mar) == IMAGE_BODY_BYTES
    # `hookwatch profile` rebuilds the profile from the same directory.
    from hookwatch.tools import cli

    out = tmp_path / "again.npz"
    code = cli.main(
        ["profile", "--mar", str(mar), "--data", str(tmp_path / "ref"), "--out", str(out)]
    )
    assert code == 0 and out.is_file()
    photo = _file(rng.integers(0, 256, (60, 90, 3), dtype=np.uint8), "JPEG")
    with archived_handler(mar, tmp_path / "served") as (handler_, context):
        # A raw body (curl -T), a multipart field and base64 JSON: one answer each.
        answers = handled(
            handler_,
            [
                {"body": bytearray(photo)},
                {"data": bytearray(photo)},
                {"body": {"data": base64.b64encode(photo).decode()}},
            ],
            context,
        )
        assert all(set(a) == {"class", "probabilities"} for a in answers), answers
        assert answers[0] == answers[1] == answers[2]
        # A bare JSON string (TorchServe hands it over parsed), and several under the field:
        # "not JSON" and "numbers of shape [3, 16, 16]" before.
        encoded = base64.b64encode(photo).decode()
        bare, listed = handled(
            handler_, [{"body": encoded}, {"body": {"data": [encoded, encoded]}}], context
        )
        assert bare == answers[0] and listed == [answers[0], answers[0]], (bare, listed)
        (bad,) = handled(handler_, [{"body": bytearray(b"not a picture")}], context)
        assert bad["code"] == 400 and "an image file" in bad["expected"], bad


def _folders(root: Path, layout: dict[str, int]) -> None:
    for folder, count in layout.items():
        for i in range(count):
            path = root / folder / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(_file(RGB))


def test_class_folders_label_their_images_where_their_names_say_the_class(
    tmp_path: Path,
) -> None:
    from hookwatch.tools.images import folder_labels, image_files
    from hookwatch.tools.labels import reference_labels

    named = tmp_path / "named"
    _folders(named, {"dog": 2, "cat": 3})
    found = reference_labels(None, named, ("cat", "bird", "dog"))
    assert found is not None
    y, where = found
    # In the files' order (sorted paths: cat/ first), each its folder's index in the labels.
    assert [p.parent.name for p in image_files(named)] == ["cat"] * 3 + ["dog"] * 2
    assert y.tolist() == [0, 0, 0, 2, 2] and "named as handler.labels" in where
    with pytest.raises(ConfigError, match=r"got dog in .* that no label is"):
        folder_labels(named, ("cat", "bird"))
    indexed = tmp_path / "indexed"
    _folders(indexed, {"7": 1, "10": 2})
    found = folder_labels(indexed, None)
    assert found is not None and found[0].tolist() == [10, 10, 7]
    # Names that are not classes (a folder per day), or images outside folders: no labels.
    days = tmp_path / "days"
    _folders(days, {"2026-11-01": 1, "2026-11-02": 1})
    assert folder_labels(days, None) is None
    assert folder_labels(days, ("cat", "dog")) is None
    (named / "loose.png").write_bytes(_file(RGB))
    assert folder_labels(named, ("cat", "dog")) is None
    # --reference-labels wins over the folders.
    np.save(tmp_path / "y.npy", np.arange(5))
    given = reference_labels(tmp_path / "y.npy", indexed)
    assert given is not None and given[0].tolist() == [0, 1, 2, 3, 4]


_PNG = _file(RGB, "PNG")
_JPEG = _file(RGB, "JPEG")


@settings(max_examples=300, deadline=None)
@given(
    which=st.sampled_from([_PNG, _JPEG, _file(RGB, "GIF"), _file(RGB, "WEBP")]),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=8),
    cut=st.integers(0, 10_000),
)
def test_mutated_image_files_decode_or_get_a_named_4xx(
    which: bytes, flips: list[tuple[int, int]], cut: int
) -> None:
    """Flipped bytes and truncations of real files (headers included): every one is an item of
    the shape or a 400/413 with a reason of the vocabulary, never another exception."""
    data = bytearray(which[: max(1, cut % (len(which) + 1))])
    for position, value in flips:
        data[position % len(data)] = value
    try:
        x = _pipeline([3, 16, 16]).decode(bytes(data))
    except BadInputError as error:
        assert error.reason in REJECT_REASONS and error.reason != "unreadable", error
    else:
        assert x.shape == (3, 16, 16) and bool(torch.isfinite(x).all())


SEGMENTER = (
    "import torch\n"
    "from torch import nn\n"
    "class Seg(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        torch.manual_seed(0)\n"
    "        self.conv = nn.Conv2d(3, 4, 3, padding=1)\n"
    "        self.act = nn.ReLU()\n"
    "        self.out = nn.Conv2d(4, 2, 1)\n"
    "    def forward(self, x):\n"
    "        return self.out(self.act(self.conv(x)))\n"
)


def test_a_class_map_model_is_archived_from_class_folders_their_labels_left_unused(
    tmp_path: Path,
) -> None:
    # A segmentation model's images kept in folders named by class index: the folders'
    # labels made `archive` fail ("expected logits [batch, classes], got per-position
    # logits... archive it without labels"), with no way to leave them out but moving the
    # files (an outside run, 2026-12-07). Labels the reference carries are left unused.
    (tmp_path / "seg.py").write_text(SEGMENTER)
    _folders(tmp_path / "ref", {"0": 20, "1": 20})
    config = tmp_path / "seg.yaml"
    handler = {
        "input": {"shape": [3, 16, 16], "encoding": "image"},
        "monitoring": {"layers": ["act"], "output": {"head": "logits"}},
    }
    config.write_text(yaml.safe_dump({"handler": handler}))
    said: list[str] = []
    mar = archive_model(
        ModelRef.parse(f"{tmp_path / 'seg.py'}:Seg"),
        "seg",
        config,
        tmp_path / "ref",
        tmp_path / "store",
        tmp_path / "build",
        say=said.append,
    )
    assert mar.is_file()
    assert any("left unused" in line and "per position" in line for line in said), said
    # Labels given on purpose still fail, saying why.
    np.save(tmp_path / "y.npy", np.zeros(40, dtype=np.int64))
    with pytest.raises(ConfigError, match="per-position logits"):
        archive_model(
            ModelRef.parse(f"{tmp_path / 'seg.py'}:Seg"),
            "seg",
            config,
            tmp_path / "ref",
            tmp_path / "store2",
            tmp_path / "build2",
            labels=tmp_path / "y.npy",
            say=said.append,
        )
