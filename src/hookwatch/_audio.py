"""WAV request bodies: a PCM ``.wav`` file as one item of a waveform input.

An input of one dimension (``[samples]``) or two (``[channels, samples]``) takes a WAV file as
its body, as speech and audio clients send a recording: its samples as floats in [-1, 1]
(integer PCM scaled by its full range), downmixed to mono for a one-dimensional input. Python's
own ``wave`` module reads it; nothing is resampled: ``input.sample_rate`` refuses a file of
another rate.
"""

from __future__ import annotations

import io
import wave

import numpy as np
import torch

from hookwatch._errors import BadInputError

__all__ = ["decode_wav", "wav_like"]


def wav_like(body: object) -> bool:
    """A body that is a RIFF WAVE file."""
    return (
        isinstance(body, bytes | bytearray) and body[:4] == b"RIFF" and bytes(body[8:12]) == b"WAVE"
    )


def decode_wav(
    data: bytes, shape: tuple[int, ...], length_dim: int | None, sample_rate: int | None
) -> torch.Tensor:
    """One WAV file → a float32 tensor of ``shape``: ``[samples]``, ``[channels, samples]``,
    or ``[samples, channels]`` where the samples' count varies in the first dimension
    (``length_dim`` 0); the count may vary up to its size where ``length_dim`` is its
    dimension. A :class:`BadInputError` says what else came."""
    last = len(shape) == 2 and length_dim == 0
    at = 0 if last else len(shape) - 1
    try:
        with wave.open(io.BytesIO(data)) as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            frames = wav.readframes(wav.getnframes())
        if channels < 1 or width < 1:
            raise wave.Error(f"{channels} channels of {width}-byte samples")
    except Exception as error:
        # wave reads integer PCM only: a float or compressed WAV is refused by name, and
        # whatever else a malformed header makes it raise (struct's, EOF) is the file's.
        raise BadInputError(
            "a PCM WAV file (8, 16, 24 or 32-bit integer samples)",
            f"one that does not read ({str(error)[:120] or type(error).__name__})",
            reason="not_json",
        ) from None
    if sample_rate is not None and rate != sample_rate:
        raise BadInputError(
            f"audio at {sample_rate} Hz (input.sample_rate; resample before sending)",
            f"{rate} Hz",
            reason="wrong_shape",
        )
    # A file cut inside its last frame: the whole frames only.
    frames = frames[: len(frames) - len(frames) % (width * channels)]
    samples = _pcm(frames, width).reshape(-1, channels).T  # [channels, samples]
    count = samples.shape[1]
    longest = shape[at]
    if count == 0 or (count != longest if length_dim is None else count > longest):
        wanted = f"{longest}" if length_dim is None else f"1 to {longest}"
        raise BadInputError(f"{wanted} samples", f"{count} samples", reason="wrong_shape")
    if len(shape) == 1:
        # One dimension: the recording in mono, its channels averaged.
        return torch.from_numpy(samples.mean(axis=0, dtype=np.float32))
    wanted_channels = shape[1] if last else shape[0]
    if channels != wanted_channels:
        layout = "[samples, channels]" if last else "[channels, samples]"
        raise BadInputError(
            f"{wanted_channels} channels (input.shape {layout})",
            f"{channels} channels",
            reason="wrong_shape",
        )
    return torch.from_numpy(np.ascontiguousarray(samples.T if last else samples, np.float32))


def _pcm(frames: bytes, width: int) -> np.ndarray:
    """Little-endian integer PCM as floats in [-1, 1]: 8-bit unsigned, wider signed."""
    if width == 1:
        return (np.frombuffer(frames, np.uint8).astype(np.float32) - 128.0) / 128.0
    if width == 3:
        raw = np.frombuffer(frames, np.uint8).reshape(-1, 3)
        wide = (
            raw[:, 0].astype(np.int32)
            | (raw[:, 1].astype(np.int32) << 8)
            | (raw[:, 2].astype(np.int32) << 16)
        )
        wide = np.where(wide >= 1 << 23, wide - (1 << 24), wide)
        return wide.astype(np.float32) / float(1 << 23)
    dtype = {2: "<i2", 4: "<i4"}.get(width)
    if dtype is None:
        raise BadInputError(
            "a PCM WAV file (8, 16, 24 or 32-bit integer samples)",
            f"{8 * width}-bit samples",
            reason="wrong_type",
        )
    return np.frombuffer(frames, dtype).astype(np.float32) / float(1 << (8 * width - 1))
