"""A camera for the robot loops: OpenCV's VideoCapture (a device index, or a video file that plays in a
loop for dry runs), read on its own thread so the loop always takes the newest frame and never
blocks on a stalled camera: `latest(max_age_s)` raises `CameraTimeout` instead.

OpenCV (`pip install 'heisd[robot]'`) is imported only when a camera opens.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from heisd.errors import HeisdError


class CameraTimeout(HeisdError):
    pass


class OpenCVCamera:
    def __init__(self, source: int | str, size: int | None = 224):
        """`source`: a device index (0: the first camera) or a video file; `size`: frames are resized
        to size x size (the target's input; a smaller request) with area interpolation, None: as read."""
        self.source, self.size = source, size
        self._lock = threading.Lock()
        self._frame: np.ndarray | None = None
        self._stamp = 0.0  # monotonic time of the newest frame
        self._error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._capture = None

    def open(self) -> OpenCVCamera:
        try:
            import cv2
        except ImportError as err:
            raise CameraTimeout(f"OpenCV is not installed ({err}): pip install 'heisd[robot]'") from None
        self._cv2 = cv2
        self._capture = cv2.VideoCapture(self.source)
        if not self._capture.isOpened():
            raise CameraTimeout(f"camera {self.source!r}: OpenCV cannot open it")
        self._file = isinstance(self.source, str)
        fps = self._capture.get(cv2.CAP_PROP_FPS) if self._file else 0.0
        self._period = 1.0 / fps if fps and fps > 0 else 0.0  # a file plays at its own rate
        self._thread = threading.Thread(target=self._run, name="heisd-camera", daemon=True)
        self._thread.start()
        return self

    def latest(self, max_age_s: float) -> np.ndarray:
        """The newest frame (uint8 [H, W, 3], RGB), waiting up to `max_age_s` for one no older than that."""
        deadline = time.monotonic() + max_age_s
        while True:
            with self._lock:
                frame, stamp, error = self._frame, self._stamp, self._error
            now = time.monotonic()
            if frame is not None and now - stamp <= max_age_s:
                return frame
            if error is not None or now > deadline:
                age = "no frame yet" if frame is None else f"newest frame {now - stamp:.2f} s old"
                raise CameraTimeout(f"camera {self.source!r}: {error or age} (limit {max_age_s:g} s)")
            time.sleep(0.002)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
        if self._capture is not None:
            self._capture.release()

    def __enter__(self) -> OpenCVCamera:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self) -> None:
        cv2 = self._cv2
        while not self._stop.is_set():
            t0 = time.monotonic()
            ok, bgr = self._capture.read()
            if not ok and self._file:  # end of the file: play it again
                self._capture.set(cv2.CAP_PROP_POS_FRAMES, 0)
                ok, bgr = self._capture.read()
            if not ok:
                with self._lock:
                    self._error = "OpenCV read no frame (camera unplugged?)"
                return
            rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
            if self.size is not None and rgb.shape[:2] != (self.size, self.size):
                rgb = cv2.resize(rgb, (self.size, self.size), interpolation=cv2.INTER_AREA)
            with self._lock:
                self._frame, self._stamp = rgb, time.monotonic()
            if self._period:
                self._stop.wait(max(self._period - (time.monotonic() - t0), 0.0))
