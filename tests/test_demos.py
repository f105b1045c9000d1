import json

import h5py
import numpy as np
import pytest

from heisd.data.dataset import ActionStats, DemoFile, DemoFormatError, compute_action_stats
from heisd.runtime.demos import generate_demos
from heisd.runtime.recording import DemoConfig


@pytest.fixture(scope="module")
def demo_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("demos") / "mw.hdf5"
    cfg = DemoConfig(tasks=("reach-v3", "drawer-close-v3"), episodes=1, seed=7, image_size=64)
    report = generate_demos(cfg, out, progress=False)
    return out, report


def test_layout_and_dtypes(demo_file):
    path, report = demo_file
    assert report["kept"] == 2 and sum(report["dropped"].values()) == 0
    with h5py.File(path) as h5:
        data = h5["data"]
        assert data.attrs["benchmark"] == "mw"
        assert json.loads(data.attrs["env_args"])["tasks"] == ["reach-v3", "drawer-close-v3"]
        g = data["demo_0"]
        t = g["actions"].shape[0]
        assert g["actions"].dtype == np.float32 and g["actions"].shape == (t, 4)
        assert g["obs/agentview_rgb"].dtype == np.uint8 and g["obs/agentview_rgb"].shape == (t, 64, 64, 3)
        assert g["obs/ee_pos"].dtype == np.float32 and g["obs/ee_pos"].shape == (t, 3)
        goal = g["obs/goal_pos"][()]
        assert goal.shape == (t, 3) and np.allclose(goal, goal[0])  # reach: the goal stays put
        assert np.allclose(goal[0], g.attrs["layout"][3:6], atol=1e-6)  # reach's layout = (hand, goal)
        assert g.attrs["task"] == "reach-v3" and g.attrs["success"]
        assert "reach" in g.attrs["instruction"]
    with DemoFile(path) as f:
        eps = list(f)
        assert [e.task for e in eps] == ["reach-v3", "drawer-close-v3"]
        assert eps[0].state.shape == (len(eps[0]), 7)  # ee xyz, gripper, goal xyz
        assert np.abs(eps[0].actions).max() <= 1.0


def test_generation_is_deterministic(demo_file, tmp_path):
    path, _ = demo_file
    cfg = DemoConfig(tasks=("reach-v3",), episodes=1, seed=7, image_size=64)
    generate_demos(cfg, tmp_path / "again.hdf5", progress=False)
    with DemoFile(path) as a, DemoFile(tmp_path / "again.hdf5") as b:
        ea, eb = next(iter(a)), next(iter(b))
        np.testing.assert_array_equal(ea.actions, eb.actions)
        np.testing.assert_array_equal(ea.images, eb.images)


def test_action_stats(tmp_path):
    path = tmp_path / "s.hdf5"
    rng = np.random.default_rng(0)
    actions = rng.uniform(-2, 2, size=(1000, 4)).astype(np.float32)
    _write_minimal(path, actions)
    stats = compute_action_stats([path])
    np.testing.assert_allclose(stats.q01, np.quantile(actions, 0.01, axis=0), rtol=1e-5)
    np.testing.assert_allclose(stats.q99, np.quantile(actions, 0.99, axis=0), rtol=1e-5)
    assert (stats.min <= stats.q01).all() and (stats.q99 <= stats.max).all()
    again = ActionStats.from_dict(json.loads(json.dumps(stats.to_dict())))
    np.testing.assert_array_equal(again.q99, stats.q99)
    with pytest.raises(ValueError, match="missing"):
        ActionStats.from_dict({"q01": [0.0]})


def _write_minimal(path, actions, drop=None):
    t = len(actions)
    with h5py.File(path, "w") as h5:
        g = h5.create_group("data/demo_0")
        g.attrs.update(task="reach-v3", instruction="reach", success=True)
        g["actions"] = actions
        g["obs/agentview_rgb"] = np.zeros((t, 8, 8, 3), np.uint8)
        g["obs/ee_pos"] = np.zeros((t, 3), np.float32)
        g["obs/gripper_states"] = np.zeros((t, 1), np.float32)
        if drop:
            del g[drop]


def test_missing_key_is_named(tmp_path):
    path = tmp_path / "bad.hdf5"
    _write_minimal(path, np.zeros((5, 4), np.float32), drop="obs/ee_pos")
    with pytest.raises(DemoFormatError, match=r"bad\.hdf5: data/demo_0 is missing 'obs/ee_pos'"):
        DemoFile(path)


def test_truncated_file(demo_file, tmp_path):
    path, _ = demo_file
    cut = tmp_path / "cut.hdf5"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(DemoFormatError, match="cut.hdf5"):
        with DemoFile(cut) as f:
            list(f)


def test_not_hdf5_and_missing(tmp_path):
    (tmp_path / "x.hdf5").write_text("hello")
    with pytest.raises(DemoFormatError, match="not a readable HDF5"):
        DemoFile(tmp_path / "x.hdf5")
    with pytest.raises(DemoFormatError, match="no such demonstration file"):
        DemoFile(tmp_path / "nope.hdf5")


def test_target_rollouts_keep_every_episode_and_feed_a_datastore(tmp_path):
    """`demos --policy DIR` records the target's own closed-loop episodes (failed ones too, tagged
    "target"); build-datastore keeps them whole and fits the kinematic statistics on the expert's."""
    from helpers import tiny_vla

    from heisd.retrieval import build_datastore, open_datastore
    from heisd.runtime.demos import generate_demos
    from heisd.runtime.recording import DemoConfig

    vla = tiny_vla()
    vla.save_pretrained(tmp_path / "vla")
    cfg = DemoConfig(("reach-v3",), episodes=2, seed=3, image_size=32, max_steps=6, policy=str(tmp_path / "vla"))
    result = generate_demos(cfg, tmp_path / "rollouts.hdf5", progress=False)
    assert result["kept"] == 2 and result["dropped"] == {}  # a random target fails: kept anyway
    with DemoFile(tmp_path / "rollouts.hdf5") as f:
        assert f.attrs["source"] == "target" and [ep.success for ep in f] == [False, False]
        assert all(len(ep) == 6 for ep in f)
    expert = DemoConfig(("reach-v3",), episodes=1, seed=0, image_size=32)
    generate_demos(expert, tmp_path / "expert.hdf5", progress=False)
    summary = build_datastore(vla, [tmp_path / "expert.hdf5", tmp_path / "rollouts.hdf5"], tmp_path / "store")
    assert [s["source"] for s in summary["sources"]] == ["expert", "target"]
    assert summary["sources"][1]["episodes"] == [1, 3] and summary["sources"][1]["frames"] == 12
    store = open_datastore(tmp_path / "store", vla)
    assert len(store.episode) == summary["sources"][0]["frames"] + 12
    with pytest.raises(Exception, match="expert demonstrations"):
        build_datastore(vla, [tmp_path / "rollouts.hdf5"], tmp_path / "store2")


def test_demo_seeds_stay_clear_of_evaluation_layouts():
    from heisd.runtime.evaluation import EVAL_SEED_OFFSET
    from heisd.runtime.recording import DemoConfig

    with pytest.raises(ValueError, match="evaluation layouts"):
        DemoConfig(("reach-v3",), episodes=1, seed=EVAL_SEED_OFFSET)


class _Interrupted:
    """Runs jobs in this process and is killed (KeyboardInterrupt) when job `after` would be handed over;
    `ran` lists the (task, index) of every job it ran."""

    def __init__(self, after: int | None = None):
        self.after, self.ran = after, []

    def map(self, work, jobs, ordered=False, **_):
        from heisd.executors import LocalExecutor

        for n, (job, result) in enumerate(LocalExecutor().map(work, jobs, ordered=ordered)):
            if n == self.after:
                raise KeyboardInterrupt
            self.ran.append(job[:2])
            yield job, result


def test_a_killed_recording_resumes_with_only_the_missing_episodes(tmp_path):
    from heisd.errors import OutputError
    from heisd.runtime.episode_store import partial_path

    cfg = DemoConfig(tasks=("reach-v3", "drawer-close-v3"), episodes=2, seed=7, image_size=32)
    out = tmp_path / "d.hdf5"
    killed = _Interrupted(after=3)
    with pytest.raises(KeyboardInterrupt):
        generate_demos(cfg, out, progress=False, executor=killed)
    assert not out.exists() and len(list(partial_path(out).glob("*.pkl.z"))) == 3
    with pytest.raises(OutputError, match=r"other settings \(seed\)"):  # kept episodes of other settings
        generate_demos(DemoConfig(cfg.tasks, 2, seed=8, image_size=32), out, progress=False)
    resumed = _Interrupted()
    generate_demos(cfg, out, progress=False, executor=resumed)
    assert resumed.ran == [("drawer-close-v3", 1)] and not partial_path(out).exists()
    generate_demos(cfg, tmp_path / "whole.hdf5", progress=False)
    with DemoFile(out) as a, DemoFile(tmp_path / "whole.hdf5") as b:
        assert len(list(a)) == len(list(b)) == 4
        for ea, eb in zip(a, b, strict=True):
            assert ea.task == eb.task
            np.testing.assert_array_equal(ea.actions, eb.actions)
            np.testing.assert_array_equal(ea.images, eb.images)


def test_kept_episodes_of_other_settings_go_only_with_overwrite(tmp_path):
    from heisd.errors import OutputError
    from heisd.runtime.episode_store import partial_path

    out = tmp_path / "d.hdf5"
    with pytest.raises(KeyboardInterrupt):
        generate_demos(DemoConfig(("reach-v3",), 2, seed=7, image_size=32), out, progress=False,
                       executor=_Interrupted(after=1))
    other = DemoConfig(("reach-v3",), 1, seed=7, image_size=32, noise=0.1)
    with pytest.raises(OutputError, match=r"other settings \(noise\).*--overwrite"):
        generate_demos(other, out, progress=False)
    ran = _Interrupted()
    generate_demos(other, out, progress=False, overwrite=True, executor=ran)
    assert ran.ran == [("reach-v3", 0)] and not partial_path(out).exists()  # the old episode was not reused
    partial_path(out).mkdir()  # not a recording's: never removed, even with --overwrite
    with pytest.raises(OutputError, match="not a recording's finished episodes"):
        generate_demos(other, out, progress=False, overwrite=True)
    assert partial_path(out).is_dir()
