"""TensorFlow's image ops that OpenVLA's LIBERO protocol runs, written again on numpy so that heisd's frames
equal TF's without TensorFlow: its JPEG round trip, `tf.image.resize(method="lanczos3", antialias=True)`,
`tf.image.crop_and_resize` (bilinear) and `tf.image.convert_image_dtype` both ways.

Float work is float32 in TF's order of operations, so results agree with TF's to the last bit or so,
which after rounding to uint8 leaves a few values in 100,000 one grey level apart (tests/test_tf_frames.py
checks this against TF's own outputs on real LIBERO frames).

JPEG: TF encodes with libjpeg-turbo defaults (quality 95, 4:2:0, no optimization), which PIL's encoder
reproduces byte for byte in the scan data; TF decodes with libjpeg's fast integer IDCT (JDCT_IFAST, TF's
default `dct_method`) and fancy chroma upsampling. PIL cannot select the IDCT, so decoding uses
`simplejpeg` (MIT, a ~0.4 MB wheel over a bundled libjpeg-turbo, numpy its only dependency): its
`fastdct=True` is JDCT_IFAST and `fastupsample=False` keeps fancy upsampling. PyTurboJPEG needs a system
libturbojpeg and imagecodecs is a 26 MB wheel of codecs heisd does not use.
"""

from __future__ import annotations

import io

import numpy as np

F32 = np.float32
JPEG_QUALITY = 95  # tf.image.encode_jpeg's default
LANCZOS_RADIUS = 3.0


def jpeg_round_trip(image: np.ndarray) -> np.ndarray:
    """`tf.io.decode_image(tf.image.encode_jpeg(image), expand_animations=False, dtype=tf.uint8)`."""
    import simplejpeg
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="JPEG", quality=JPEG_QUALITY, subsampling="4:2:0")
    return simplejpeg.decode_jpeg(buf.getvalue(), colorspace="RGB", fastdct=True, fastupsample=False)


def _lanczos(x: np.ndarray) -> np.ndarray:
    # TF's kernel in float32, with its own value of pi; sin is taken in float64 and rounded, as a correctly
    # rounded sinf would give (numpy's float32 sin may differ from libm's by an ulp)
    pi, r = F32(3.14159265359), F32(LANCZOS_RADIUS)
    x = np.abs(x.astype(F32))
    px = pi * x
    num = r * np.sin(px.astype(np.float64)).astype(F32) * np.sin((px / r).astype(np.float64)).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = num / (pi * pi * x * x)
    return np.where(x > r, F32(0), np.where(x <= F32(1e-3), F32(1), w)).astype(F32)


def _spans(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """TF's scale-and-translate spans along one axis: for each output pixel, the input indices it reads
    (n_out, span) and their normalized weights, zero past the span's end."""
    scale = F32(n_out) / F32(n_in)
    inv_scale = F32(1.0 / float(scale))
    kernel_scale = max(inv_scale, F32(1))  # antialias: the kernel widens by the downscale factor
    reach = F32(LANCZOS_RADIUS) * kernel_scale
    span = min(2 * int(np.ceil(reach)) + 1, n_in)
    sample = (np.arange(n_out, dtype=F32) + F32(0.5)) * inv_scale  # output pixel centres in input coordinates
    start = np.clip(np.ceil(sample - reach - F32(0.5)).astype(np.int64), 0, n_in - 1)
    end = np.clip(np.floor(sample + reach - F32(0.5)).astype(np.int64), 0, n_in - 1) + 1
    src = start[:, None] + np.arange(span)[None, :]
    pos = (src.astype(F32) + F32(0.5) - sample[:, None]) * (F32(1) / kernel_scale)
    w = np.where(src < end[:, None], _lanczos(pos), F32(0)).astype(F32)
    total = np.cumsum(w, axis=1, dtype=F32)[:, -1]  # summed in order, as TF's loop does
    w = w * (F32(1) / total)[:, None]
    return np.minimum(src, n_in - 1), w


def _gather(image: np.ndarray, src: np.ndarray, w: np.ndarray, axis: int) -> np.ndarray:
    # one weighted input slice at a time, accumulated in float32 in span order, as TF's GatherRows/Columns
    out = np.zeros(image.shape[:axis] + (src.shape[0],) + image.shape[axis + 1:], dtype=F32)
    shape = [1] * image.ndim
    shape[axis] = src.shape[0]
    for j in range(src.shape[1]):
        out += w[:, j].reshape(shape) * np.take(image, src[:, j], axis=axis)
    return out


def resize_lanczos3(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """`tf.image.resize(image, size, method="lanczos3", antialias=True)`: (H, W, C) -> float32 (h, w, C).
    Rows first into a float32 intermediate, then columns: no rounding between the passes."""
    img = image.astype(F32)
    rows = _gather(img, *_spans(img.shape[0], size[0]), axis=0)
    return _gather(rows, *_spans(img.shape[1], size[1]), axis=1)


def round_to_uint8(image: np.ndarray) -> np.ndarray:
    """OpenVLA's `tf.cast(tf.clip_by_value(tf.round(img), 0, 255), tf.uint8)` (tf.round: half to even)."""
    return np.clip(np.round(image), 0, 255).astype(np.uint8)


def uint8_to_float(image: np.ndarray) -> np.ndarray:
    """`tf.image.convert_image_dtype(image, tf.float32)`: x * float32(1/255)."""
    return image.astype(F32) * F32(1.0 / 255)


def float_to_uint8(image: np.ndarray) -> np.ndarray:
    """`tf.image.convert_image_dtype(image, tf.uint8, saturate=True)`: x * 255.5, clipped to [0, 255],
    then truncated (not rounded): 0.999 of a level becomes the level below."""
    return np.clip(image.astype(F32) * F32(255.5), 0, 255).astype(np.uint8)


def crop_and_resize(image: np.ndarray, box: tuple[float, float, float, float],
                    size: tuple[int, int]) -> np.ndarray:
    """`tf.image.crop_and_resize` (bilinear) of one float (H, W, C) image and one box (y1, x1, y2, x2) in
    normalized coordinates, corner-aligned: output row i samples y1 * (H - 1) + i * (y2 - y1) * (H - 1) /
    (h - 1). The box must lie inside the image (TF would fill outside samples with a constant)."""
    img = image.astype(F32)
    y1, x1, y2, x2 = (F32(v) for v in box)

    def grid(lo: np.float32, hi: np.float32, n_in: int, n_out: int):
        step = (hi - lo) * F32(n_in - 1) / F32(n_out - 1) if n_out > 1 else F32(0)
        pos = lo * F32(n_in - 1) + np.arange(n_out, dtype=F32) * step
        if n_out == 1:
            pos = np.array([F32(0.5) * (lo + hi) * F32(n_in - 1)], dtype=F32)
        if pos.min() < 0 or pos.max() > n_in - 1:
            raise ValueError(f"crop box {box} reaches outside the image")
        low = np.floor(pos).astype(np.int64)
        return low, np.ceil(pos).astype(np.int64), (pos - low.astype(F32)).astype(F32)

    top_i, bottom_i, fy = grid(y1, y2, img.shape[0], size[0])
    left_i, right_i, fx = grid(x1, x2, img.shape[1], size[1])
    fx, fy = fx[None, :, None], fy[:, None, None]
    top_l, top_r = img[top_i][:, left_i], img[top_i][:, right_i]
    bot_l, bot_r = img[bottom_i][:, left_i], img[bottom_i][:, right_i]
    top = top_l + (top_r - top_l) * fx
    bottom = bot_l + (bot_r - bot_l) * fx
    return top + (bottom - top) * fy
