"""The server's parts without HTTP: episode sessions (pooling, expiry), the model worker's queue, the
msgpack array codec (against openpi-client's own), openpi's observation mapping."""

from __future__ import annotations

import threading
import time

import pytest

import numpy as np
from openpi_client import msgpack_numpy

from heisd.serving import msgpack_arrays
from heisd.serving.openpi import parse_observation
from heisd.serving.sessions import SessionLimits, SessionStore, TooManyEpisodes, UnknownEpisode
from heisd.serving.wire import WireError, WireLimits
from heisd.serving.worker import ModelWorker, QueueFull


class Recorder:
    """A stand-in policy that records what the store does to it (the store only resets it)."""

    def __init__(self):
        self.resets: list[tuple[str, str | None]] = []

    def reset(self, instruction: str, task: str | None = None) -> None:
        self.resets.append((instruction, task))


def test_sessions_pool_policies_and_expire_idle_episodes():
    now = [0.0]
    built: list[Recorder] = []

    def make() -> Recorder:
        built.append(Recorder())
        return built[-1]

    store = SessionStore(make, SessionLimits(max_sessions=2, idle_timeout_s=10.0), clock=lambda: now[0])
    a = store.start("a", "open the drawer", "drawer-open-v3")
    store.start("b", "close the drawer", None)
    with pytest.raises(TooManyEpisodes):
        store.start("c", "open the door", None)
    assert len(built) == 2 and a.policy.resets == [("open the drawer", "drawer-open-v3")]
    store.end("a")
    c = store.start("c", "open the door", None)  # a's policy, reset: no third build
    assert len(built) == 2 and c.policy is a.policy and c.policy.resets[-1] == ("open the door", None)
    now[0] = 5.0
    store.get("c", "open the door")  # c used at t=5, b last at t=0
    now[0] = 12.0
    with pytest.raises(UnknownEpisode, match="expired after 10 s"):
        store.get("b", "close the drawer")
    assert store.expired == 1 and store.get("c", "open the door").policy is a.policy
    store.start("d", "open the door", None)  # b's expired policy is reused
    assert len(built) == 2


def test_worker_runs_in_order_and_refuses_when_full():
    worker = ModelWorker(max_queue=2)
    started, release, order = threading.Event(), threading.Event(), []
    blocker = worker.submit(lambda: (started.set(), release.wait(10)))
    assert started.wait(10)
    queued = [worker.submit(lambda i=i: order.append(i) or i) for i in range(2)]
    assert worker.depth == 2
    with pytest.raises(QueueFull, match="--queue-size"):
        worker.submit(lambda: None)
    time.sleep(0.05)
    release.set()
    assert [f.result(10).value for f in queued] == [0, 1] and order == [0, 1]
    assert blocker.result(10).run_ms >= 50 and all(f.result().queue_ms >= 50 for f in queued)  # waited for it
    failing = worker.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failing.result(10)
    assert worker.submit(lambda: "still up").result(10).value == "still up"
    worker.close()
    assert not worker.alive


def test_msgpack_arrays_speak_openpi_clients_format():
    """Ours -> openpi_client.msgpack_numpy and back: every plain dtype, any layout, scalars; what
    cannot be built from a buffer (object dtypes) or does not fit its shape is a WireError."""
    import msgpack

    rng = np.random.default_rng(0)
    arrays = {"u8": rng.integers(0, 256, (4, 5, 3), dtype=np.uint8), "f4": rng.normal(size=(2, 7)).astype(np.float32),
              "f8": rng.normal(size=3), "i64": np.arange(6).reshape(2, 3), "b": np.array([True, False]),
              "transposed": rng.normal(size=(3, 4)).T, "empty": np.zeros((0, 3))}
    theirs = msgpack_numpy.unpackb(msgpack_arrays.packb({**arrays, "scalar": np.int16(-3)}))
    ours = msgpack_arrays.unpackb(msgpack_numpy.packb({**arrays, "scalar": np.int16(-3)}))
    for decoded in (theirs, ours):
        for name, array in arrays.items():
            np.testing.assert_array_equal(decoded[name], array)
            assert decoded[name].dtype == array.dtype and decoded[name].shape == array.shape
        assert decoded["scalar"] == -3 and decoded["scalar"].dtype == np.int16
    bad = [
        ({b"__ndarray__": True, b"data": b"12345678", b"dtype": "|O", b"shape": [1]}, "refused"),
        ({b"__ndarray__": True, b"data": b"123", b"dtype": "<f4", b"shape": [1]}, "do not fit"),
        ({b"__ndarray__": True, b"data": b"1234", b"dtype": "<f4", b"shape": [-1]}, "non-negative"),
        ({b"__ndarray__": True, b"data": "1234", b"dtype": "<f4", b"shape": [1]}, "must be bytes"),
        ({b"__ndarray__": True, b"data": b"1234", b"dtype": "nonsense", b"shape": [1]}, "unknown dtype"),
        ({b"__npgeneric__": True, b"data": [1], b"dtype": "<i4"}, "must be a number"),
    ]
    for obj, message in bad:
        with pytest.raises(WireError, match=message):
            msgpack_arrays.unpackb(msgpack.packb({"x": obj}))
    with pytest.raises(TypeError):
        msgpack_arrays.packb({"x": np.array(["text"], dtype=object)})


def test_openpi_observations_map_to_requests():
    image = np.zeros((6, 8, 3), np.uint8)
    limits = WireLimits()
    libero = parse_observation({"observation/image": image, "observation/wrist_image": image,
                                "observation/state": np.arange(7.0), "prompt": "pick it", "ee_pos": [0.1, 0.2, 0.3]},
                               limits, takes_state=True, episode_id="e")
    req = libero.request
    assert req.instruction == "pick it" and req.episode_id == "e" and not libero.reset and not libero.end
    np.testing.assert_array_equal(req.proprio, np.arange(7.0))
    np.testing.assert_array_equal(req.ee_pos, [[0.1, 0.2, 0.3]])
    aloha = parse_observation({"images": {"cam_left_wrist": image[:, :, 0] * 0, "cam_high": image.transpose(2, 0, 1)},
                               "state": np.zeros(14), "prompt": "fold", "reset": np.bool_(True)},
                              limits, takes_state=False, episode_id="e")
    assert aloha.request.image.shape == (6, 8, 3) and aloha.request.proprio is None and aloha.reset  # state ignored
    end = parse_observation({"end": True, "success": False}, limits, takes_state=True, episode_id="e")
    assert end.end and end.success is False and end.request is None
    for obs, message in [({"prompt": "x"}, "image: missing"), ({"image": image}, "prompt: missing"),
                         ({"image": image, "prompt": 3}, "prompt: expected a string"),
                         ({"image": image, "prompt": "x", "state": ["a"]}, "state: expected a float array"),
                         ({"end": "yes"}, "end: expected true or false")]:
        with pytest.raises(WireError, match=message):
            parse_observation(obs, limits, takes_state=True, episode_id="e")
