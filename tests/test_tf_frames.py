"""heisd's OpenVLA frames against TensorFlow's, on real LIBERO frames.

tests/golden/tf_frames.npz holds three upright 256 px LIBERO-Object agentview frames and TF 2.21's
outputs of the protocol's ops on them (JPEG round trip, lanczos3 resize to 224, and the 0.9-area center
crop); tests/golden/README.md has the commands that made it. TF is not needed here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from heisd.benchmarks import tf_image
from heisd.benchmarks.libero_protocol import center_crop, openvla_image

GOLDEN = np.load(Path(__file__).parent / "golden" / "tf_frames.npz")
MAX_DIFFERING = 1e-3  # fraction of values allowed one grey level off (float32 order of operations)


def _check_close(ours: np.ndarray, tf: np.ndarray) -> None:
    assert ours.shape == tf.shape and ours.dtype == np.uint8
    diff = np.abs(ours.astype(np.int16) - tf.astype(np.int16))
    assert diff.max() <= 1, f"up to {diff.max()} grey levels from TF's"
    assert (diff > 0).mean() < MAX_DIFFERING, f"{(diff > 0).mean():.2%} of values differ from TF's"


@pytest.mark.parametrize("i", range(len(GOLDEN["frames"])))
def test_openvla_image_is_tfs(i):
    _check_close(openvla_image(GOLDEN["frames"][i]), GOLDEN["plain"][i])


@pytest.mark.parametrize("i", range(len(GOLDEN["frames"])))
def test_openvla_image_with_crop_is_tfs(i):
    _check_close(openvla_image(GOLDEN["frames"][i], crop=True), GOLDEN["crop"][i])


def test_center_crop_of_tfs_resize_is_tfs_crop():
    # the crop on its own, from TF's own input to it
    for plain, crop in zip(GOLDEN["plain"], GOLDEN["crop"]):
        _check_close(center_crop(plain), crop)


def test_the_golden_frames_are_not_equal_to_tfs_by_accident():
    # PIL's accurate IDCT and its uint8 rounding between the Lanczos passes miss TF's by several levels
    from PIL import Image

    frame = GOLDEN["frames"][0]
    pil = np.asarray(Image.fromarray(frame).resize((224, 224), Image.Resampling.LANCZOS))
    assert np.abs(pil.astype(np.int16) - GOLDEN["plain"][0]).max() > 1


def test_uint8_float_round_trip_and_truncation_are_tfs():
    levels = np.arange(256, dtype=np.uint8)
    assert np.array_equal(tf_image.float_to_uint8(tf_image.uint8_to_float(levels)), levels)
    # TF scales by 255.5 and truncates: a value just under a level's centre falls to the level below
    assert tf_image.float_to_uint8(np.array([0.999 / 255.5, 1.5, -0.2], np.float32)).tolist() == [0, 255, 0]


def test_lanczos_resize_keeps_a_flat_image_flat_and_stays_in_float():
    flat = np.full((256, 256, 3), 200, np.uint8)
    out = tf_image.resize_lanczos3(flat, (224, 224))
    assert out.dtype == np.float32 and out.shape == (224, 224, 3)
    assert np.abs(out - 200).max() < 1e-3
    ramp = np.tile(np.arange(256, dtype=np.uint8)[None, :, None], (4, 1, 1))
    assert not np.allclose(tf_image.resize_lanczos3(ramp, (4, 224)) % 1, 0)  # no rounding inside
