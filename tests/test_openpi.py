"""`heisd serve --protocol openpi`: openpi's websocket protocol, driven by the real openpi-client
(`WebsocketClientPolicy`, msgpack_numpy) and the real websockets client, on 127.0.0.1."""

from __future__ import annotations

import time

import msgpack
import numpy as np
import pytest
import requests
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from test_serve import CONFIG, DRAWER, REACH, built, comparable, fresh_policy, heisd_method, observations  # noqa: F401
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from heisd.client import OpenpiClient, PolicyClient, RemotePolicy, ServerError
from heisd.runtime.methods import MethodConfig
from heisd.serving.launch import ServerThread, make_service
from heisd.serving.metrics import ServerMetrics
from heisd.serving.service import ServeConfig
from heisd.serving.sessions import SessionLimits

# openpi-client 0.1.2 holds its connection outside a `with` block, which websockets 17 warns about
pytestmark = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")


def serve(vla, method: MethodConfig, config: ServeConfig = CONFIG, protocols=("openpi",),
          target: str = "vla") -> ServerThread:
    return ServerThread(*make_service(vla, method, config, target), protocols=protocols)


@pytest.fixture(scope="module")
def server(built):
    vla, tmp = built
    with serve(vla, heisd_method(tmp), protocols=("rest", "openpi"), target=str(tmp / "vla")) as s:
        yield s


def openpi_obs(image, state, path, prompt: str, **extra) -> dict:
    """An observation laid out as openpi's LIBERO client sends it, plus heisd's ee_pos."""
    return {"observation/image": image, "observation/wrist_image": np.zeros_like(image),
            "observation/state": state, "prompt": prompt, "ee_pos": path, **extra}


def test_openpi_client_runs_episodes_with_the_in_process_actions(built, server):
    """WebsocketClientPolicy, unchanged: metadata on connect, then two episodes on one connection
    (the second starts on a new prompt, as openpi's LIBERO client switches tasks) give the actions
    and step records of fresh in-process episodes; "end" closes an episode like POST /end."""
    vla, tmp = built
    client = WebsocketClientPolicy(server.ws_url)
    meta = client.get_server_metadata()
    assert meta["protocol"] == "openpi" and meta["method"] == "heisd+threshold@0.3"
    assert meta["target"]["action_shape"] == [2, 4] and meta["protocols"] == ["rest", "openpi"]
    for seed, prompt, task, curve in [(11, REACH, "reach-v3", 0.0), (12, DRAWER, "drawer-close-v3", 0.05)]:
        obs = observations(seed, 8, curve)
        policy = fresh_policy(vla, heisd_method(tmp))
        policy.reset(prompt, task)
        for image, state, path in obs:
            expected, record = policy.act(image, state, path)
            reply = client.infer(openpi_obs(image, state, path, prompt, task=task))
            np.testing.assert_array_equal(reply["actions"], expected)
            assert comparable(reply["heisd_step"]) == comparable(record)
            assert reply["server_timing"]["infer_ms"] > 0
        assert record.metric is not None  # the kinematic window filled: ee_pos reached the switch
    assert "prev_total_ms" in reply["server_timing"]
    end = client.infer({"end": True, "success": True})
    assert end["steps"] == 8 and end["success"] is True
    client._ws.close()


def test_remote_policy_over_the_websocket_equals_in_process(built, server):
    """heisd's own OpenpiClient behind RemotePolicy (what `heisd eval --server ws://...` and the robot
    loops use): reset per episode, the same steps as in process, a lost connection reported."""
    vla, tmp = built
    remote = RemotePolicy(OpenpiClient(server.ws_url))
    for seed in (21, 22):
        policy = fresh_policy(vla, heisd_method(tmp))
        for p in (policy, remote):
            p.reset(REACH, "reach-v3")
        for image, state, path in observations(seed, 5, 0.02):
            expected, record = policy.act(image, state, path)
            actions, served = remote.act(image, state, path)
            np.testing.assert_array_equal(actions, expected)
            assert comparable(served) == comparable(record)
        remote.end_episode(success=False)
    remote.client.close()
    with pytest.raises(ServerError, match="reset=True") as err:
        remote.client.act(*observations(1, 1, 0.0)[0][:1], REACH)
    assert err.value.status == 404


def _refused(url: str, frame, expect_status: int, expect_text: str) -> None:
    """One bad frame: openpi's error text frame, then a close with 4000 + the REST status."""
    with connect(url, compression=None, max_size=None) as ws:
        msgpack_numpy.unpackb(ws.recv(10))  # metadata
        ws.send(frame)
        text = ws.recv(10)
        assert isinstance(text, str) and expect_text in text, text
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(10)
    assert closed.value.rcvd.code == 4000 + expect_status, (closed.value.rcvd, text)
    assert closed.value.rcvd.reason.startswith(text[:60])


def test_bad_frames_close_with_the_rest_status(server):
    ok = np.zeros((16, 16, 3), np.uint8)
    state = np.zeros(7, np.float32)
    good = {"observation/image": ok, "observation/state": state, "prompt": REACH}
    cases = [
        ("not msgpack at all", 400, "expected a binary frame"),
        (b"\xc1", 400, "not valid msgpack"),
        (b"\x91" * 100_000 + b"\xc0", 400, "nested too deeply"),
        (msgpack.packb([1, 2]), 422, "expected a map"),
        (msgpack.packb({**{k: v for k, v in good.items() if k != "observation/image"}}, default=msgpack_numpy.pack_array),
         422, "image: missing"),
        (msgpack_numpy.packb({**good, "prompt": ""}), 422, "instruction: empty"),
        (msgpack_numpy.packb({k: v for k, v in good.items() if k != "prompt"}), 422, "prompt: missing"),
        (msgpack_numpy.packb({**good, "observation/image": ok.astype(np.float32)}), 422,
         "observation/image: dtype float32"),
        (msgpack_numpy.packb({**good, "observation/image": np.zeros((65, 8, 3), np.uint8)}), 413, "exceeds 64"),
        (msgpack_numpy.packb({**good, "observation/state": np.zeros(8)}), 422, "proprio: shape [8], expected [7]"),
        (msgpack_numpy.packb({**good, "observation/state": np.full(7, np.nan)}), 422, "non-finite"),
        (msgpack_numpy.packb({**good, "ee_pos": np.zeros((2, 2))}), 422, "ee_pos: shape [2, 2]"),
        (msgpack_numpy.packb({**good, "task": "fly-v3"}), 422, "task: unknown 'fly-v3'"),
        (msgpack_numpy.packb({**good, "reset": "yes"}), 422, "reset: expected true or false"),
        (msgpack.packb({**msgpack_numpy.unpackb(msgpack_numpy.packb(good)),
                        "observation/image": {b"__ndarray__": True, b"data": b"x" * 8, b"dtype": "|O",
                                              b"shape": [1]}}, default=msgpack_numpy.pack_array),
         400, "dtype '|O' refused"),
        (msgpack.packb({**msgpack_numpy.unpackb(msgpack_numpy.packb(good)),
                        "observation/image": {b"__ndarray__": True, b"data": b"x" * 7, b"dtype": "|u1",
                                              b"shape": [16, 16, 3]}}, default=msgpack_numpy.pack_array),
         400, "do not fit shape"),
    ]
    for frame, status, text in cases:
        _refused(server.ws_url, frame, status, text)
    with connect(server.ws_url, compression=None, max_size=None) as ws:  # over serve --max-body-mb
        ws.recv(10)
        ws.send(b"\x00" * (CONFIG.max_body_bytes + 1))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(10)
        assert closed.value.rcvd.code == 1009
    client = WebsocketClientPolicy(server.ws_url)  # openpi's client sees the message as RuntimeError
    with pytest.raises(RuntimeError, match="proprio: missing"):
        client.infer({"observation/image": ok, "prompt": REACH})
    assert WebsocketClientPolicy(server.ws_url).infer(good)["actions"].shape == (2, 4)  # still serving


def test_limits_are_shared_with_the_rest_side(built):
    """One server, both protocols: an open websocket episode counts against --max-sessions (a REST
    episode is refused with 503, a second websocket closes with 4503), and closing the connection
    frees it; a full queue closes with 4503."""
    vla, _ = built
    image, state, _ = observations(4, 1, 0.0)[0]
    config = ServeConfig(queue_size=1, sessions=SessionLimits(max_sessions=1))
    with serve(vla, MethodConfig("ar"), config, protocols=("rest", "openpi")) as s:
        first = OpenpiClient(s.ws_url)
        first.act(image, REACH, proprio=state, reset=True)
        rest = PolicyClient(s.url)
        with pytest.raises(ServerError) as err:
            rest.act(image, REACH, proprio=state, episode_id="r", reset=True)
        assert err.value.status == 503 and "--max-sessions" in err.value.message
        second = OpenpiClient(s.ws_url)
        with pytest.raises(ServerError) as err:
            second.act(image, REACH, proprio=state, reset=True)
        assert err.value.status == 503 and "--max-sessions" in err.value.message
        first.close()  # its episode ends on the server
        deadline = time.monotonic() + 60  # generous: a loaded machine once took longer than 10 s
        while s.service.sessions.open and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not s.service.sessions.open, "the closed connection's episode was not ended within 60 s"
        rest.act(image, REACH, proprio=state, episode_id="r", reset=True)
        rest.end("r", success=None)

        import threading

        started, release = threading.Event(), threading.Event()
        s.service.worker.submit(lambda: (started.set(), release.wait(30)))
        assert started.wait(10)
        waiting = s.service.worker.submit(lambda: None)  # the queue (1) is full
        try:
            with pytest.raises(ServerError) as err:
                OpenpiClient(s.ws_url).act(image, REACH, proprio=state, reset=True)
            assert err.value.status == 503 and "queue is full" in err.value.message
        finally:
            release.set()
        waiting.result(10)


def test_a_connection_refused_its_session_queues_no_end_when_it_closes(built):
    """A step refused for --max-sessions started no session, so the connection's close queues no end:
    with --queue-size 1 that end could take the slot the end of a connection that did hold an
    episode needs, leaving its episode to expire (the flake this test pins down)."""
    import asyncio

    from heisd.serving.sessions import TooManyEpisodes
    from heisd.serving.websocket import Episode

    vla, _ = built
    image, state, _ = observations(4, 1, 0.0)[0]
    config = ServeConfig(queue_size=1, sessions=SessionLimits(max_sessions=1))
    service, _ = make_service(vla, MethodConfig("ar"), config, "vla")
    metrics = ServerMetrics(service.worker.depth, lambda: len(service.sessions.open))
    try:
        frame = {"bytes": msgpack_numpy.packb({"observation/image": image, "observation/state": state,
                                               "prompt": REACH})}
        first, second = Episode(service, "first"), Episode(service, "second")
        asyncio.run(first.handle(frame, time.perf_counter(), None, metrics))
        with pytest.raises(TooManyEpisodes):
            asyncio.run(second.handle(frame, time.perf_counter(), None, metrics))
        assert not second.open and first.open
        submitted = []
        service.worker.submit = lambda fn: submitted.append(fn)  # what a close queues, not run
        second.close()
        assert submitted == []
        first.close()
        assert len(submitted) == 1
    finally:
        service.close()


def test_protocols_choose_the_routes(built):
    vla, _ = built
    with serve(vla, MethodConfig("ar"), protocols=("openpi",)) as s:
        assert requests.get(f"{s.url}/healthz").status_code == 200  # openpi's health check path
        assert requests.post(f"{s.url}/act", data=b"{}").status_code in (404, 405)
        assert PolicyClient(s.url).info()["protocols"] == ["openpi"]
    with serve(vla, MethodConfig("ar"), protocols=("rest",)) as s:
        with pytest.raises(Exception):
            connect(s.ws_url, open_timeout=5).recv(5)


def test_loadtest_alternates_rest_and_websocket(built, server, tmp_path):
    """`heisd loadtest` on a server with both protocols: the one-client pass serves every step over
    each, in turn; no served step differs from in process (the threshold switch: no mode depends on timing)."""
    import json

    from heisd.cli import main

    _, tmp = built
    out = tmp_path / "load.json"
    assert main(["loadtest", "--server", server.url, "--demos", str(tmp / "demos.hdf5"), "--clients", "2",
                 "--requests", "3", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["protocols"] == ["rest", "openpi"]
    one = report["one_client"]
    for name in ("rest", "openpi"):
        assert one[name]["mismatched"] == one[name]["different_mode"] == 0
        assert one[name]["outside_step_ms"]["p50"] > 0 and one[name]["added_ms"]["p90"] is not None
        many = report["concurrent"][name]
        assert many["ok"] == 6 and many["errors"] == {} and many["mismatched"] == many["different_mode"] == 0
