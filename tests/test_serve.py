"""`heisd serve` through a real uvicorn on 127.0.0.1 (a free port), against in-process policies
built independently from the same target, drafter and datastore."""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
import time
from dataclasses import asdict

import json_numpy
import numpy as np
import pytest
import requests
from helpers import save_tiny_drafter, tiny_vla, write_demo_file

from heisd.benchmarks.mw import TASKS
from heisd.client import PolicyClient, RemotePolicy, ServerError
from heisd.retrieval import build_datastore
from heisd.runtime.methods import MethodConfig, build_decoders
from heisd.runtime.policy import VLAPolicy
from heisd.serving.launch import ServerThread, make_service
from heisd.serving.config import ServeConfig
from heisd.serving.sessions import SessionLimits
from heisd.serving.wire import WireLimits

REACH, DRAWER = TASKS["reach-v3"].instruction, TASKS["drawer-close-v3"].instruction
CONFIG = ServeConfig(queue_size=2, max_body_bytes=256 << 10, wire=WireLimits(max_image_side=64))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    vla = tiny_vla()
    vla.save_pretrained(tmp / "vla")
    save_tiny_drafter(vla, tmp / "drafter")
    write_demo_file(tmp / "demos.hdf5", ["reach-v3", "drawer-close-v3"], episodes=2, steps=20)
    build_datastore(vla, [tmp / "demos.hdf5"], tmp / "datastore")
    return vla, tmp


def heisd_method(tmp, datastore: str = "datastore") -> MethodConfig:
    return MethodConfig("heisd", drafter=str(tmp / "drafter"), datastore=str(tmp / datastore),
                       switch="threshold", switch_threshold=0.3)  # deterministic: the cost switch reacts to timing


def serve(vla, method: MethodConfig, config: ServeConfig = CONFIG, target: str = "vla") -> ServerThread:
    return ServerThread(*make_service(vla, method, config, target))


@pytest.fixture(scope="module")
def server(built):
    vla, tmp = built
    with serve(vla, heisd_method(tmp), target=str(tmp / "vla")) as s:
        yield s


def fresh_policy(vla, method: MethodConfig) -> VLAPolicy:
    return VLAPolicy(vla, build_decoders(method, vla))


def observations(seed: int, n: int, curve: float):
    """n (image, state, env-step positions since the last call) on a path bent by `curve`."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        t = np.array([2 * i, 2 * i + 1], dtype=float)[:, None]  # two env steps per call (chunk 2)
        path = np.concatenate([0.01 * t, 0.6 + curve * np.sin(0.3 * t), 0.2 + 0.0 * t], axis=1)
        state = np.concatenate([path[-1], [1.0], [0.1, 0.7, 0.2]]).astype(np.float32)
        out.append((rng.integers(0, 256, (16, 16, 3), dtype=np.uint8), state, path))
    return out


def post(url: str, payload, path: str = "/act") -> requests.Response:
    body = payload if isinstance(payload, (bytes, str)) else json_numpy.dumps(payload)
    return requests.post(url + path, data=body, headers={"Content-Type": "application/json"}, timeout=30)


def comparable(record) -> dict:
    """A step record without its wall-clock numbers."""
    d = asdict(record) if not isinstance(record, dict) else dict(record)
    return {k: v for k, v in d.items() if k not in ("latency_ms", "breakdown_ms", "decode_ms", "expected_ms")}


# ----- the OpenVLA deploy.py wire format -----

@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")  # the stateless target's empty state_proj
def test_deploy_style_client_gets_the_in_process_action(built, monkeypatch):
    """A client written like deploy.py's (json_numpy.patch() + requests.post(...).json()), on a
    target that takes no state: plain and {"encoded": ...} requests give the in-process action."""
    import json as json_module

    for name in ("dumps", "loads", "dump", "load"):  # json_numpy.patch() is global: undo it afterwards
        monkeypatch.setattr(json_module, name, getattr(json_module, name))
    vla = tiny_vla(seed=1, state_dim=0)
    image = np.random.default_rng(0).integers(0, 256, (24, 20, 3), dtype=np.uint8)
    policy = fresh_policy(vla, MethodConfig("ar"))
    policy.reset(DRAWER, "drawer-close-v3")
    expected, _ = policy.act(image, np.zeros(0, np.float32))
    with serve(vla, MethodConfig("ar")) as s:
        json_numpy.patch()
        action = requests.post(f"{s.url}/act", json={"image": image, "instruction": DRAWER, "unnorm_key": "mw"}).json()
        encoded = requests.post(f"{s.url}/act",
                                json={"encoded": json_module.dumps({"image": image, "instruction": DRAWER})})
        encoded_action = json_numpy.loads(encoded.json())
    assert isinstance(action, np.ndarray) and action.shape == (2, 4)
    np.testing.assert_array_equal(action, expected)
    np.testing.assert_array_equal(encoded_action, expected)


def test_one_off_step_matches_a_fresh_policy(built, server):
    """No episode_id: the step is decoded as the first of a new episode, and the step record comes back."""
    vla, tmp = built
    image, state, path = observations(0, 1, 0.0)[0]
    policy = fresh_policy(vla, heisd_method(tmp))
    policy.reset(REACH, "reach-v3")
    expected, record = policy.act(image, state, path)
    for _ in range(2):  # twice: the pooled policy keeps nothing from the first
        step = PolicyClient(server.url).act(image, REACH, proprio=state, ee_pos=path)
        np.testing.assert_array_equal(step.actions, expected)
        assert comparable(step.record) == comparable(record)
        assert step.timing_ms["step"] > 0 and step.timing_ms["total"] >= step.timing_ms["step"]


def test_msgpack_and_json_requests_get_the_same_step(built, server):
    """PolicyClient's msgpack requests (its default) and deploy.py's JSON give the same actions and
    step record; a malformed msgpack body gets the status its JSON twin would."""
    import msgpack
    from openpi_client import msgpack_numpy

    image, state, path = observations(8, 1, 0.0)[0]
    steps = [PolicyClient(server.url, encoding=e).act(image, REACH, proprio=state, ee_pos=path) for e in ("msgpack", "json")]
    np.testing.assert_array_equal(steps[0].actions, steps[1].actions)
    assert comparable(steps[0].record) == comparable(steps[1].record)
    good = {"image": image, "instruction": REACH, "proprio": state}
    cases = [(b"\xc1", 400, "not valid msgpack"), (msgpack.packb([1]), 422, "expected a msgpack map"),
             (msgpack.packb({"instruction": REACH}), 422, "image: missing"),
             (msgpack.packb({**good, "image": [1, 2]}, default=msgpack_numpy.pack_array), 422,
              "image: expected a msgpack-numpy array"),
             (msgpack_numpy.packb({**good, "proprio": np.zeros(7, np.int32)}), 422, "proprio: dtype int32"),
             (msgpack_numpy.packb({**good, "reset": True}), 422, "reset: needs an episode_id")]
    for body, status, message in cases:
        response = requests.post(f"{server.url}/act", data=body, headers={"Content-Type": "application/msgpack"})
        assert response.status_code == status and message in response.json()["error"], response.text


# ----- sessions -----

def alone_in_process(vla, tmp, episodes: dict) -> dict:
    """Each episode's (actions, record) per step, decoded by its own fresh in-process policy."""
    expected = {}
    for name, (instruction, task, obs) in episodes.items():
        policy = fresh_policy(vla, heisd_method(tmp))
        policy.reset(instruction, task)
        expected[name] = [policy.act(*o) for o in obs]
    return expected


def test_interleaved_episodes_equal_separate_runs(built, server):
    """Two episodes stepped alternately through the server decode exactly as each does alone
    in process: prompts, kinematic windows (the metric) and proposer state stay apart."""
    vla, tmp = built
    episodes = {"a": (REACH, "reach-v3", observations(1, 10, 0.0)),
                "b": (DRAWER, "drawer-close-v3", observations(2, 10, 0.05))}
    expected = alone_in_process(vla, tmp, episodes)
    client = PolicyClient(server.url)
    got = {name: [] for name in episodes}
    for i in range(10):
        for name, (instruction, task, obs) in episodes.items():
            image, state, path = obs[i]
            got[name].append(client.act(image, instruction, proprio=state, ee_pos=path, episode_id=f"il-{name}",
                                        reset=i == 0, task=task))
    for name in episodes:
        for step, (actions, record) in zip(got[name], expected[name]):
            np.testing.assert_array_equal(step.actions, actions)
            assert comparable(step.record) == comparable(record)
        assert expected[name][-1][1].metric is not None  # the window filled: the metric was compared
    assert [r.metric for _, r in expected["a"]] != [r.metric for _, r in expected["b"]]
    for name in episodes:
        assert client.end(f"il-{name}", success=None)["steps"] == 10


def test_a_warmed_up_server_steps_as_a_cold_one(built):
    """The warm-up's steps (a synthetic observation, before listening) leave nothing in the episodes
    that follow; /info says what they took (no graphs on a CPU)."""
    vla, tmp = built
    episodes = {"a": (REACH, "reach-v3", observations(1, 10, 0.0))}
    expected = alone_in_process(vla, tmp, episodes)["a"]
    with serve(vla, heisd_method(tmp), dataclasses.replace(CONFIG, warmup_steps=3)) as s:
        client = PolicyClient(s.url)
        assert client.info()["warmup"] == {"steps": 3, "seconds": pytest.approx(0.0, abs=60), "graphs_captured": 0}
        for i, (image, state, path) in enumerate(episodes["a"][2]):
            step = client.act(image, REACH, proprio=state, ee_pos=path, episode_id="w", reset=i == 0, task="reach-v3")
            np.testing.assert_array_equal(step.actions, expected[i][0])
            assert comparable(step.record) == comparable(expected[i][1])
    with pytest.raises(ValueError, match="warmup_steps must be >= 0"):
        ServeConfig(warmup_steps=-1)


def test_episode_errors(built, server):
    vla, tmp = built
    image, state, path = observations(3, 1, 0.0)[0]
    client = PolicyClient(server.url)
    with pytest.raises(ServerError) as err:
        client.act(image, REACH, proprio=state, episode_id="never-started")
    assert err.value.status == 404 and "reset=true" in err.value.message
    client.act(image, REACH, proprio=state, episode_id="e1", reset=True)
    with pytest.raises(ServerError) as err:
        client.act(image, DRAWER, proprio=state, episode_id="e1")
    assert err.value.status == 409 and "instruction" in err.value.message
    client.act(image, DRAWER, proprio=state, episode_id="e1", reset=True)  # a restart may change it
    assert client.end("e1", success=None)["steps"] == 1
    for call in (lambda: client.end("e1", success=True), lambda: client.act(image, DRAWER, proprio=state,
                                                                            episode_id="e1")):
        with pytest.raises(ServerError) as err:
            call()
        assert err.value.status == 404


def test_too_many_episodes_is_503(built):
    vla, _ = built
    image, state, _ = observations(4, 1, 0.0)[0]
    config = ServeConfig(sessions=SessionLimits(max_sessions=1))
    with serve(vla, MethodConfig("ar"), config) as s:
        client = PolicyClient(s.url)
        client.act(image, REACH, proprio=state, episode_id="one", reset=True)
        with pytest.raises(ServerError) as err:
            client.act(image, REACH, proprio=state, episode_id="two", reset=True)
        assert err.value.status == 503 and "--max-sessions" in err.value.message
        client.end("one", success=None)
        client.act(image, REACH, proprio=state, episode_id="two", reset=True)


# ----- bad input, faults, load -----

def _image_payload(image: np.ndarray, **extra) -> dict:
    return {"image": image, "instruction": REACH, "proprio": np.zeros(7, np.float32), **extra}


def test_malformed_requests_get_their_status(server):
    ok = np.zeros((16, 16, 3), np.uint8)
    good = json.loads(json_numpy.dumps(_image_payload(ok)))  # plain JSON to corrupt field by field
    bad_b64 = {**good, "image": {**good["image"], "__numpy__": "###"}}
    short = {**good, "image": {**good["image"], "shape": [16, 17, 3]}}
    cases = [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 422, "expected a JSON object"),
        (json.dumps(bad_b64), 400, "image: undecodable"),
        (json.dumps(short), 400, "image: undecodable"),
        (json.dumps({**good, "image": [[1, 2, 3]]}), 422, "image: expected a json-numpy array"),
        ({"instruction": REACH, "proprio": np.zeros(7, np.float32)}, 422, "image: missing"),
        (_image_payload(ok.astype(np.float32)), 422, "image: dtype float32"),
        (_image_payload(ok[..., 0]), 422, "image: shape [16, 16]"),
        (_image_payload(np.zeros((65, 8, 3), np.uint8)), 413, "exceeds 64 pixels"),
        ({"image": ok, "proprio": np.zeros(7, np.float32)}, 422, "instruction: missing"),
        (_image_payload(ok, instruction=""), 422, "instruction: empty"),
        ({"image": ok, "instruction": REACH}, 422, "proprio: missing"),
        (_image_payload(ok, proprio=np.zeros(6, np.float32)), 422, "proprio: shape [6]"),
        (_image_payload(ok, proprio=np.zeros(7, np.int64)), 422, "proprio: dtype int64"),
        (_image_payload(ok, proprio=np.full(7, np.nan, np.float32)), 422, "proprio: non-finite"),
        (_image_payload(ok, ee_pos=np.zeros((2, 2))), 422, "ee_pos: shape [2, 2]"),
        (_image_payload(ok, unnorm_key="libero_spatial"), 422, "unnorm_key: unknown 'libero_spatial'"),
        (_image_payload(ok, task="fly-v3"), 422, "task: unknown 'fly-v3'"),
        (_image_payload(ok, reset=True), 422, "reset: needs an episode_id"),
        (_image_payload(ok, reset="yes", episode_id="x"), 422, "reset: expected true or false"),
        ({"encoded": json_numpy.dumps(_image_payload(ok)), "instruction": REACH}, 422, "carries nothing else"),
        (b"x" * (300 << 10), 413, "exceeds 262144"),
        # structure: nesting beyond the JSON decoder's depth, and values of the wrong kind
        (b"[" * 20_000 + b"]" * 20_000, 400, "request body: JSON nested too deeply"),
        (b'{"a":' * 20_000 + b"1" + b"}" * 20_000, 400, "request body: JSON nested too deeply"),
        (json.dumps({**good, "proprio": "@"}).replace('"@"', "[" * 20_000 + "]" * 20_000), 400,
         "request body: JSON nested too deeply"),
        (json.dumps({"encoded": "[" * 20_000 + "]" * 20_000}), 400, "'encoded': JSON nested too deeply"),
        (json.dumps({**good, "proprio": {"x": [1.0] * 7}}), 422, "proprio: expected a json-numpy array"),
        (json.dumps({**good, "proprio": [0.0] * 7}), 422, "proprio: expected a json-numpy array"),
        (json.dumps({**good, "image": {**good["image"], "shape": {"h": 16}}}), 400, "image: undecodable"),
        (json.dumps({**good, "image": {**good["image"], "dtype": ["uint8"]}}), 400, "image: undecodable"),
        (json.dumps({**good, "instruction": ["reach"]}), 422, "instruction: expected a string, got list"),
        (json.dumps({**good, "reset": [[0] * 5000], "episode_id": "x"}), 422,
         "reset: expected true or false, got an array"),
        (json.dumps({"encoded": json.dumps([good])}), 422, "'encoded': expected a JSON object, got list"),
    ]
    for payload, status, message in cases:
        response = post(server.url, payload)
        assert response.status_code == status, (message, response.text)
        assert message in response.json()["error"], response.json()
    chunked = requests.post(f"{server.url}/act", data=iter([b"x" * (100 << 10)] * 3))  # no Content-Length
    assert chunked.status_code == 413 and "exceeds 262144" in chunked.json()["error"]
    assert post(server.url, {"episode_id": "x", "success": 1}, "/end").status_code == 422
    for body, status, message in [(b"[" * 20_000 + b"]" * 20_000, 400, "nested too deeply"),
                                  (b'[{"episode_id": "x"}]', 422, "expected a JSON object, got list"),
                                  (b'{"episode_id": {"id": "x"}}', 422, "episode_id: expected a string, got dict")]:
        response = post(server.url, body, "/end")
        assert response.status_code == status and message in response.json()["error"], response.text
    assert post(server.url, _image_payload(ok)).status_code == 200  # the server is fine afterwards


def test_a_full_queue_answers_503(server):
    """queue_size=2: with the worker busy and 2 requests waiting, the next is refused at once."""
    service = server.service
    started, release = threading.Event(), threading.Event()
    service.worker.submit(lambda: (started.set(), release.wait(30)))
    assert started.wait(10)
    waiting = [service.worker.submit(lambda: None) for _ in range(2)]
    try:
        response = post(server.url, _image_payload(np.zeros((16, 16, 3), np.uint8)))
        assert response.status_code == 503 and "queue is full" in response.json()["error"]
    finally:
        release.set()
    for future in waiting:
        future.result(10)
    assert post(server.url, _image_payload(np.zeros((16, 16, 3), np.uint8))).status_code == 200


def test_an_internal_fault_is_500_and_the_server_keeps_serving(built):
    """Building a new episode's policy fails inside a running server (here: made to fail, as an
    exhausted accelerator would): that request is a 500 with the cause; episodes already open go on."""
    vla, tmp = built
    image, state, path = observations(5, 1, 0.0)[0]
    with serve(vla, heisd_method(tmp)) as s:
        client = PolicyClient(s.url)
        client.act(image, REACH, proprio=state, ee_pos=path, episode_id="first", reset=True)

        def exhausted():
            raise RuntimeError("CUDA out of memory building another policy")

        s.service.sessions.make_policy = exhausted
        with pytest.raises(ServerError) as err:
            client.act(image, REACH, proprio=state, ee_pos=path, episode_id="second", reset=True)
        assert err.value.status == 500 and "RuntimeError: CUDA out of memory" in err.value.message
        client.act(image, REACH, proprio=state, ee_pos=path, episode_id="first")


def test_sessions_share_one_drafter_and_decode_independently(built):
    """Every pooled policy runs the drafter module the server loaded once (read-only, no gradients),
    each through its own proposer; two episodes interleaved on it decode as each alone in process."""
    vla, tmp = built
    with serve(vla, heisd_method(tmp)) as s:
        client = PolicyClient(s.url)
        episodes = {"a": (REACH, "reach-v3", observations(31, 6, 0.0)),
                    "b": (DRAWER, "drawer-close-v3", observations(32, 6, 0.08))}
        expected = alone_in_process(vla, tmp, episodes)
        for i in range(6):
            for name, (instruction, task, obs) in episodes.items():
                image, state, path = obs[i]
                step = client.act(image, instruction, proprio=state, ee_pos=path, episode_id=name, reset=i == 0,
                                  task=task)
                np.testing.assert_array_equal(step.actions, expected[name][i][0])
                assert comparable(step.record) == comparable(expected[name][i][1])
        a, b = (s.service.sessions.open[name].policy for name in ("a", "b"))
        assert a is not b and a.decoders.drafter is b.decoders.drafter is not None
        proposers = [p.decoders.by_mode["drafter"].proposer for p in (a, b)]
        assert proposers[0] is not proposers[1]
        assert proposers[0].drafter is proposers[1].drafter is a.decoders.drafter
        assert not any(w.requires_grad for w in a.decoders.drafter.parameters())
        assert all(any(r.mode == "drafter" for _, r in expected[name]) for name in episodes)  # it ran in both


# ----- operations -----

def test_healthz_info_metrics(built, server):
    vla, tmp = built
    session = requests.Session()
    times = []
    for _ in range(7):  # one kept-alive connection: without TCP_NODELAY each reply waits ~40 ms for an ACK
        t0 = time.perf_counter()
        assert session.get(f"{server.url}/healthz").json() == {"status": "ok"}
        times.append(time.perf_counter() - t0)
    assert np.median(times) < 0.025
    info = PolicyClient(server.url).info()
    assert info["target"]["fingerprint"] == vla.fingerprint() and info["target"]["action_shape"] == [2, 4]
    assert info["method"] == "heisd+threshold@0.3" and info["datastore"]["path"] == str(tmp / "datastore")
    assert info["versions"]["heisd"] and info["limits"]["queue_size"] == 2

    def scrape() -> dict[str, float]:
        text = requests.get(f"{server.url}/metrics").text
        return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))}

    before = scrape()
    image, state, path = observations(6, 1, 0.0)[0]
    step = PolicyClient(server.url).act(image, REACH, proprio=state, ee_pos=path)
    post(server.url, b"{")
    after = scrape()
    delta = lambda key: after.get(key, 0.0) - before.get(key, 0.0)  # noqa: E731
    assert delta('heisd_requests_total{path="/act",status="200"}') == 1
    assert delta('heisd_errors_total{path="/act",status="400"}') == 1
    assert delta(f'heisd_steps_total{{mode="{step.record["mode"]}"}}') == 1
    assert delta("heisd_target_forwards_total") == step.record["target_forwards"]
    assert delta("heisd_step_latency_seconds_count") == 1
    assert after["heisd_queue_depth"] == 0


def test_client_survives_a_server_restart(built):
    """The server goes away and comes back on the same port: the same client object reaches it
    (a request made while it is down waits for it), and an episode it lost is reported, not mixed up."""
    vla, _ = built
    image, state, _ = observations(7, 1, 0.0)[0]
    first = serve(vla, MethodConfig("ar"))
    first.__enter__()
    client = PolicyClient(first.url, connect_retries=12, backoff_s=0.05)
    client.act(image, REACH, proprio=state, episode_id="kept", reset=True)
    port = int(first.url.rsplit(":", 1)[1])
    first.stop()
    later: list[ServerThread] = []

    def restart() -> None:
        time.sleep(0.5)
        later.append(ServerThread(*make_service(vla, MethodConfig("ar"), CONFIG, "vla"), port=port).__enter__())

    thread = threading.Thread(target=restart)
    thread.start()
    try:
        step = client.act(image, REACH, proprio=state, episode_id="new", reset=True)  # sent while down
        assert step.actions.shape == (2, 4)
        with pytest.raises(ServerError) as err:
            client.act(image, REACH, proprio=state, episode_id="kept")
        assert err.value.status == 404 and "restarted" in err.value.message
    finally:
        thread.join()
        for s in later:
            s.stop()


def test_loadtest_command(built, server, tmp_path):
    """`heisd loadtest` against the served tiny target: every request answered, every served
    step equal to the in-process one, the report written."""
    from heisd.cli import main

    _, tmp = built
    out = tmp_path / "load.json"
    # 2 clients: at most 1 running + 1 waiting, within the test server's queue of 2
    assert main(["loadtest", "--server", server.url, "--demos", str(tmp / "demos.hdf5"), "--clients", "2",
                 "--requests", "4", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["method"] == "heisd+threshold@0.3" and report["protocols"] == ["rest"]
    one, many = report["one_client"], report["concurrent"]["rest"]
    assert one["requests"] == 4 and one["rest"]["mismatched"] == one["rest"]["different_mode"] == 0
    assert many["requests_sent"] == many["ok"] == 8 and many["errors"] == {} and many["mismatched"] == 0
    assert many["different_mode"] == 0  # the threshold switch: modes never depend on timing
    assert many["throughput_rps"] > 0 and many["rtt_ms"]["p99"] >= many["rtt_ms"]["p50"] > 0


# ----- the closed loop -----

def test_eval_through_the_server_equals_in_process(built):
    """`heisd eval --server`'s loop: two episodes (the second after the first's outcome moved the
    adaptive skips) give the same episode lines as in process, wall-clock numbers aside."""
    from heisd.runtime.evaluation import EvalConfig, evaluate

    vla, tmp = built
    for copy in ("ds_local", "ds_served"):  # each run adapts its own thresholds (in memory)
        shutil.copytree(tmp / "datastore", tmp / copy)
    cfg = EvalConfig(("reach-v3",), episodes=2, seed=0, max_steps=8, image_size=32)
    local = evaluate(fresh_policy(vla, heisd_method(tmp, "ds_local")), "heisd", cfg, tmp / "local", progress=False)
    with serve(vla, heisd_method(tmp, "ds_served")) as s:
        served = evaluate(RemotePolicy(PolicyClient(s.url)), "heisd", cfg, tmp / "served", progress=False)
    lines = {name: [json.loads(line) for line in (tmp / name / "episodes.jsonl").read_text().splitlines()]
             for name in ("local", "served")}
    for a, b in zip(lines["local"], lines["served"], strict=True):
        for line in (a, b):
            for timing in ("latency_ms", "breakdown_ms", "decode_ms", "expected_ms"):
                del line["steps"][timing]
        del a["thresholds"]  # the local run folder keeps its thresholds; the server keeps its own
        assert a == b
    assert local["sr"] == served["sr"] and local["episodes"] == served["episodes"] == 2
    original = (tmp / "datastore" / "manifest.json").read_bytes()
    assert (tmp / "ds_local" / "manifest.json").read_bytes() == (tmp / "ds_served" / "manifest.json").read_bytes() \
        == original  # read-only at run time, served or not



# ----- an OpenVLA checkpoint -----

def test_openvla_server_takes_the_checkpoints_own_unnorm_keys(tiny_openvla_dir, tiny_openvla):
    """No benchmark given: the LIBERO suite its unnorm key names. /info advertises the checkpoint's
    norm_stats keys (the loaded one first); a request naming another gets the same tokens de-normalized
    with that key's statistics, as a target loaded with that key acts."""
    from heisd.targets.openvla import load_openvla

    image = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    with serve(tiny_openvla, MethodConfig("ar"), target=str(tiny_openvla_dir)) as s:
        info = PolicyClient(s.url).info()
        assert info["unnorm_keys"] == ["libero_spatial_no_noops", "bridge_orig"]
        assert info["benchmark"] == "libero_spatial" and info["target"]["protocol"] == "openvla"
        assert len(info["tasks"]) == 10  # the suite's task registry
        task, instruction = next(iter(info["tasks"].items()))
        replies = {}
        for key in (None, "libero_spatial", "libero_spatial_no_noops", "bridge_orig", "mw"):
            response = post(s.url, {"image": image, "instruction": instruction,
                                    **({} if key is None else {"unnorm_key": key})})
            replies[key] = response.json() if response.status_code != 200 else json_numpy.loads(response.text)
    expected = {}
    for key, target in (("libero_spatial", tiny_openvla),
                        ("bridge_orig", load_openvla(tiny_openvla_dir, unnorm_key="bridge_orig"))):
        policy = fresh_policy(target, MethodConfig("ar"))
        policy.reset(instruction, task)
        expected[key], _ = policy.act(image, np.zeros(0, np.float32))
    assert not np.allclose(expected["libero_spatial"], expected["bridge_orig"])
    for key in (None, "libero_spatial", "libero_spatial_no_noops"):
        np.testing.assert_array_equal(replies[key], expected["libero_spatial"])
    np.testing.assert_array_equal(replies["bridge_orig"], expected["bridge_orig"])
    assert replies["mw"]["error"] == "unnorm_key: unknown 'mw'; this target has libero_spatial_no_noops, bridge_orig"


def test_a_benchmark_the_target_cannot_act_in_is_refused_at_startup(tiny_openvla_dir, tiny_openvla, capsys):
    from heisd.cli import main
    from heisd.errors import UsageError

    with pytest.raises(UsageError, match="--target's actions have 7 dims, --benchmark mw takes 4"):
        make_service(tiny_openvla, MethodConfig("ar"), CONFIG, "openvla", benchmark="mw")
    with pytest.raises(UsageError, match="--target's actions have 4 dims, --benchmark libero_object takes 7"):
        make_service(tiny_vla(), MethodConfig("ar"), CONFIG, "vla", benchmark="libero_object")
    assert main(["serve", "--target", str(tiny_openvla_dir), "--unnorm-key", "libero_spatial", "--benchmark", "mw",
                 "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "heisd serve: error: --target's actions have 7 dims, --benchmark mw takes 4"
