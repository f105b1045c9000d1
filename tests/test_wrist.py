"""A two-camera target (agentview and LIBERO's wrist camera, `train-vla --wrist`): it trains from
demonstrations that hold both cameras, its datastore and drafter see both, and a server takes both
(`heisd.data.views`: the two frames travel stacked, agentview on top)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import tiny_vla, write_libero_layout_file

from heisd.cli import main
from heisd.data.dataset import DemoFile
from heisd.targets.vla import VLA

SOUP = ("pick_up_the_alphabet_soup_and_place_it_in_the_basket", "pick up the alphabet soup and place it in the basket")
TINY_ARGS = ["--steps", "2", "--batch-size", "4", "--threads", "1", "--image-size", "16", "--vision-channels", "8,16",
             "--hidden-size", "32", "--layers", "1", "--eval-every", "2"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wrist")
    demos = tmp / f"{SOUP[0]}_demo.hdf5"
    write_libero_layout_file(demos, *SOUP, "libero_object", episodes=3, steps=20, size=32, wrist=True)
    assert main(["train-vla", "--benchmark", "libero", "--wrist", "--demos", str(demos),
                 "--out", str(tmp / "vla"), *TINY_ARGS]) == 0
    return tmp, VLA.from_pretrained(tmp / "vla")


def test_train_vla_wrist_makes_a_two_camera_target(trained):
    _, vla = trained
    assert vla.spec.views == 2 and vla.wrist_vision is not None
    assert sum(p.numel() for p in vla.wrist_vision.parameters()) == sum(p.numel() for p in vla.vision.parameters())


def test_its_datastore_keys_and_drafter_features_read_both_cameras(trained):
    from heisd.drafter.train import EpisodeRef, target_features
    from heisd.retrieval import build_datastore
    from heisd.retrieval.datastore import Datastore
    from heisd.targets.rollout import rollout_frames

    tmp, vla = trained
    demos = tmp / f"{SOUP[0]}_demo.hdf5"
    build_datastore(vla, [demos], tmp / "datastore")
    store = Datastore.load(tmp / "datastore")
    with DemoFile(demos, views=2) as f:
        ep = f.episode("demo_1")
    frames = ep.frames(2)
    with torch.no_grad():
        key = vla.retrieval_key(torch.from_numpy(frames[3:4]), torch.from_numpy(ep.state[3:4])).numpy()
    assert store.key_dim == key.shape[1] == 2 * 4 * 16 + 5
    hit = store.query(key[0], k=1)
    assert hit.similarities[0] == pytest.approx(1.0, abs=1e-5)
    assert (store.episode[hit.indices[0]], store.step[hit.indices[0]]) == (1, 3)  # the frame itself, both cameras
    refs = [EpisodeRef(demos, f"demo_{i}", 20) for i in range(3)]
    features = target_features(vla, refs, torch.tensor([20 + 3]), batch_size=4, desc="features")
    own = rollout_frames(vla, frames[3:4], ep.instruction, ep.state[3:4])
    assert torch.equal(features.tokens, own.features.tokens)


def test_wrist_training_and_encoding_refuse_what_lacks_the_camera(trained, tmp_path, capsys):
    from heisd.errors import InputError
    from heisd.retrieval import build_datastore

    _, vla = trained
    demos = tmp_path / f"{SOUP[0]}_demo.hdf5"
    write_libero_layout_file(demos, *SOUP, "libero_object", episodes=2, steps=6, size=32)  # agentview alone
    out = tmp_path / "vla"
    assert main(["train-vla", "--benchmark", "libero", "--wrist", "--demos", str(demos), "--out", str(out),
                 *TINY_ARGS]) == 1
    assert f"{demos.name}: data/demo_0 has no wrist frames" in capsys.readouterr().err and not out.exists()
    assert main(["train-vla", "--benchmark", "mw", "--wrist", "--demos", str(demos), "--out", str(out)]) == 2
    assert "--benchmark mw has none" in capsys.readouterr().err
    assert main(["train-vla", "--arch", "openvla", "--benchmark", "libero", "--wrist", "--demos", str(demos),
                 "--out", str(out)]) == 2
    assert "reads agentview alone" in capsys.readouterr().err
    with pytest.raises(InputError, match=f"{demos.name}: data/demo_0 has no wrist frames"):
        build_datastore(vla, [demos], tmp_path / "ds")


def test_the_server_takes_the_wrist_image_beside_the_image():
    import json_numpy
    import requests

    from heisd.client import PolicyClient, RemotePolicy
    from heisd.errors import InputError
    from heisd.runtime.methods import MethodConfig, build_decoders
    from heisd.runtime.policy import VLAPolicy
    from heisd.serving.config import ServeConfig
    from heisd.serving.launch import ServerThread, make_service
    from heisd.serving.openpi import parse_observation
    from heisd.serving.wire import WireLimits

    vla = tiny_vla(views=2)
    rng = np.random.default_rng(0)
    image, wrist = (rng.integers(0, 256, (16, 16, 3), dtype=np.uint8) for _ in range(2))
    state = np.zeros(vla.config.state_dim, np.float32)
    instruction = "reach the goal"
    local = VLAPolicy(vla, build_decoders(MethodConfig("ar"), vla))
    local.reset(instruction)
    expected, _ = local.act(np.concatenate([image, wrist]), state)
    with ServerThread(*make_service(vla, MethodConfig("ar"), ServeConfig(warmup_steps=2), "vla")) as s:
        assert PolicyClient(s.url).info()["target"]["views"] == 2
        remote = RemotePolicy(PolicyClient(s.url), views=2)
        remote.reset(instruction)
        served, _ = remote.act(np.concatenate([image, wrist]), state)  # sent apart: image and wrist_image
        np.testing.assert_array_equal(served, expected)
        with pytest.raises(InputError, match="a two-camera frame"):  # one camera's frame is not sent as two halves
            remote.act(np.concatenate([image, image], axis=1)[:16], state)
        for fields, problem in (({}, "wrist_image: missing"), ({"wrist_image": wrist[:8]}, "wrist_image: shape")):
            body = json_numpy.dumps({"image": image, "instruction": instruction, "proprio": state, **fields})
            reply = requests.post(s.url + "/act", data=body, timeout=30)
            assert reply.status_code == 422 and problem in reply.json()["error"]
    obs = parse_observation({"observation/image": image, "observation/wrist_image": wrist, "prompt": instruction},
                            WireLimits(), takes_state=False, episode_id="e")
    assert np.array_equal(obs.request.frame(2), np.concatenate([image, wrist]))
    assert obs.request.frame(1) is obs.request.image  # a one-camera target ignores it


def test_the_lerobot_adapter_stacks_its_wrist_camera():
    from heisd.robots.lerobot_policy import HeiSDPolicy, LeRobotAdapterConfig
    from heisd.runtime.methods import MethodConfig

    vla = tiny_vla(views=2)
    with pytest.raises(ValueError, match="give wrist_key"):
        HeiSDPolicy.in_process(vla, MethodConfig("ar"))
    policy = HeiSDPolicy.in_process(vla, MethodConfig("ar"), LeRobotAdapterConfig(wrist_key="observation.images.wrist"))
    rng = np.random.default_rng(1)
    batch = {"observation.images.agentview": rng.integers(0, 256, (1, 16, 16, 3), dtype=np.uint8),
             "observation.images.wrist": rng.integers(0, 256, (1, 16, 16, 3), dtype=np.uint8),
             "observation.state": np.zeros((1, vla.config.state_dim), np.float32), "task": ["reach the goal"]}
    image, _, _ = policy._inputs(batch)
    assert np.array_equal(image[0], np.concatenate([batch["observation.images.agentview"][0],
                                                     batch["observation.images.wrist"][0]]))
    policy.select_action(batch)
    with pytest.raises(ValueError, match="the target reads one camera"):
        HeiSDPolicy.in_process(tiny_vla(), MethodConfig("ar"), LeRobotAdapterConfig(wrist_key="observation.images.wrist"))
