"""DAgger: expert-labelled rollouts of the target, fine-tuning from a checkpoint, resumable rounds."""

import json

import numpy as np
import pytest
import torch
from helpers import tiny_vla, write_demo_file

from heisd.data.dataset import DemoFile
from heisd.errors import ConfigError, InputError, OutputError
from heisd.runtime.dagger import LOG_FILE, DaggerConfig, run_dagger
from heisd.runtime.demos import generate_demos
from heisd.runtime.evaluation import EVAL_SEED_OFFSET
from heisd.runtime.recording import DemoConfig, episode_seed, record_episode
from heisd.targets.vla import VLA, CheckpointError
from heisd.targets.vla.frames import read_episodes
from heisd.targets.vla.train import TrainConfig, train, trained_camera


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("dagger") / "vla"
    tiny_vla().save_pretrained(path)
    return path


def test_labels_are_the_experts_on_the_targets_own_path(tiny_dir):
    """The target acts either way: the visited states are the same with and without expert labels,
    only the recorded actions change, and the first one is the expert's answer at the reset state."""
    from heisd.benchmarks.mw import MetaWorldEnv, MWConfig, expert_policy

    common = dict(episodes=1, seed=3, image_size=32, max_steps=6, policy=str(tiny_dir))
    acted = record_episode("reach-v3", 0, DemoConfig(("reach-v3",), **common))
    labelled = record_episode("reach-v3", 0, DemoConfig(("reach-v3",), expert_labels=True, **common))
    np.testing.assert_array_equal(acted["images"], labelled["images"])
    np.testing.assert_array_equal(acted["ee_pos"], labelled["ee_pos"])
    assert not np.allclose(acted["actions"], labelled["actions"])
    env = MetaWorldEnv("reach-v3", MWConfig(32, "corner", 6))
    _, info = env.reset(options={"layout_seed": episode_seed(3, "reach-v3", 0)})
    first = np.clip(expert_policy("reach-v3").get_action(info["sim_obs"]), -1, 1)
    np.testing.assert_allclose(labelled["actions"][0], first, atol=1e-6)


def test_dagger_files_keep_failed_episodes_for_training_not_datastores(tiny_dir, tmp_path):
    from heisd.retrieval import build_datastore

    cfg = DemoConfig(("reach-v3",), episodes=2, seed=3, image_size=32, max_steps=5, policy=str(tiny_dir),
                     expert_labels=True)
    result = generate_demos(cfg, tmp_path / "dagger.hdf5", progress=False)
    assert result["kept"] == 2  # the random target fails both: kept, the labels are the expert's
    with DemoFile(tmp_path / "dagger.hdf5") as f:
        assert f.attrs["source"] == "dagger" and [ep.success for ep in f] == [False, False]
    records, dropped, _ = read_episodes([tmp_path / "dagger.hdf5"], 16, "mw")
    assert len(records) == 2 and dropped == 0
    with pytest.raises(InputError, match="DAgger file"):
        build_datastore(VLA.from_pretrained(tiny_dir), [tmp_path / "dagger.hdf5"], tmp_path / "store")
    with pytest.raises(ValueError, match="target checkpoint"):
        DemoConfig(("reach-v3",), episodes=1, expert_labels=True)


def test_rollout_layouts_never_reach_evaluation_layouts():
    cfg = DaggerConfig(init="x", demos=(), tasks=("reach-v3",), rounds=3, seed=20)
    seeds = [cfg.round_seed(r) for r in (1, 2, 3)]
    assert seeds == [20, 21, 22]
    rollout_layouts = {episode_seed(s, t, i) for s in seeds for t in ("reach-v3", "push-v3") for i in range(50)}
    eval_layouts = {episode_seed(EVAL_SEED_OFFSET + s, t, i) for s in range(5) for t in ("reach-v3", "push-v3")
                    for i in range(50)}
    assert not rollout_layouts & eval_layouts
    with pytest.raises(ConfigError, match="evaluation layouts"):
        DaggerConfig(init="x", demos=(), tasks=("reach-v3",), rounds=3, seed=EVAL_SEED_OFFSET - 2)
    with pytest.raises(ConfigError, match="rounds"):
        DaggerConfig(init="x", demos=(), tasks=("reach-v3",), rounds=0)


def test_init_from_fine_tunes_the_checkpoint(tiny_dir, tmp_path):
    write_demo_file(tmp_path / "d.hdf5", ["reach-v3"], episodes=3, steps=8)
    init = VLA.from_pretrained(tiny_dir)
    cfg = TrainConfig(steps=2, batch_size=4, lr=1e-3, warmup_steps=1, val_fraction=0.0, eval_every=1, save_every=2)
    train([tmp_path / "d.hdf5"], tmp_path / "ft", cfg, init_from=tiny_dir)
    tuned = VLA.from_pretrained(tmp_path / "ft")
    # tokenizers and action bins carry over (a new model would fit its bins to these random actions)
    assert tuned.norm_stats.q01.tolist() == init.norm_stats.q01.tolist()
    assert tuned.text_tokenizer.vocab_size == init.text_tokenizer.vocab_size
    # and the weights start from the checkpoint's: two small steps stay close to them
    a, b = init.state_dict(), tuned.state_dict()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 0.05
    assert any(not torch.equal(a[k], b[k]) for k in a)
    train([tmp_path / "d.hdf5"], tmp_path / "ft2", cfg, chunk=1, init_from=tiny_dir)  # re-chunked, bins kept
    rechunked = VLA.from_pretrained(tmp_path / "ft2")
    assert rechunked.config.chunk == 1 and rechunked.norm_stats.q01.tolist() == init.norm_stats.q01.tolist()
    with pytest.raises(InputError, match="not a VLA checkpoint"):
        train([tmp_path / "d.hdf5"], tmp_path / "ft3", cfg, init_from=tmp_path)


def test_rounds_resume_and_refuse_other_settings(tiny_dir, tmp_path):
    demos = tmp_path / "demos.hdf5"
    generate_demos(DemoConfig(("reach-v3",), episodes=1, seed=5, image_size=32), demos, progress=False)
    cfg = DaggerConfig(init=str(tiny_dir), demos=(str(demos),), tasks=("reach-v3",), rounds=2, episodes=1,
                       seed=20, steps=2, batch_size=4, threads=1, max_steps=4)
    final = run_dagger(cfg, tmp_path / "run", progress=False)
    assert final == tmp_path / "run" / "round_2" / "vla"
    log = [json.loads(line) for line in (tmp_path / "run" / LOG_FILE).read_text().splitlines()]
    assert [r["round"] for r in log] == [1, 2] and log[1]["actor"] == str(tmp_path / "run" / "round_1" / "vla")
    assert log[0]["actor_success"] == {"reach-v3": 0.0} and log[1]["rollout_seed"] == 21
    assert len(log[1]["data_files"]) == 3  # demos + both rounds' rollouts
    assert trained_camera(final) == "corner"  # the demos' and rollouts' camera, recorded for eval
    stamp = (final / "model.safetensors").stat().st_mtime_ns
    run_dagger(cfg, tmp_path / "run", progress=False)  # same settings: everything is done, nothing reruns
    assert (final / "model.safetensors").stat().st_mtime_ns == stamp
    assert len((tmp_path / "run" / LOG_FILE).read_text().splitlines()) == 2
    more = DaggerConfig(**{**cfg.__dict__, "rounds": 3})  # a finished run takes more rounds
    assert run_dagger(more, tmp_path / "run", progress=False) == tmp_path / "run" / "round_3" / "vla"
    assert (final / "model.safetensors").stat().st_mtime_ns == stamp
    assert [json.loads(line)["round"] for line in (tmp_path / "run" / LOG_FILE).read_text().splitlines()] == [1, 2, 3]
    other = DaggerConfig(**{**cfg.__dict__, "steps": 3})
    with pytest.raises(OutputError, match="steps"):
        run_dagger(other, tmp_path / "run", progress=False)
    saved = tmp_path / "run" / "dagger.json"
    old = json.loads(saved.read_text())
    del old["keyframe_weight"], old["keyframe_window"]
    saved.write_text(json.dumps(old))  # saved before keyframe weights: resumes as the unweighted run it was
    assert run_dagger(more, tmp_path / "run", progress=False) == tmp_path / "run" / "round_3" / "vla"
    with pytest.raises(OutputError, match="keyframe_weight"):
        run_dagger(DaggerConfig(**{**more.__dict__, "keyframe_weight": 3.0}), tmp_path / "run", progress=False)
    with pytest.raises(ConfigError, match="keyframe_weight must be > 0 and keyframe_window >= 1, got 0.0 and 8"):
        DaggerConfig(**{**cfg.__dict__, "keyframe_weight": 0.0})
    weighted = run_dagger(DaggerConfig(**{**cfg.__dict__, "rounds": 1, "keyframe_weight": 3.0, "keyframe_window": 2}),
                          tmp_path / "run4", progress=False)
    trained = json.loads((weighted / "train_info.json").read_text())["train_config"]
    assert (trained["keyframe_weight"], trained["keyframe_window"]) == (3.0, 2)  # the fine-tune weighs them
    with pytest.raises(CheckpointError, match="not a target checkpoint directory"):
        run_dagger(DaggerConfig(**{**cfg.__dict__, "init": str(tmp_path)}), tmp_path / "run3", progress=False)
    assert not (tmp_path / "run3").exists()  # refused before anything was written
    clash = DaggerConfig(**{**cfg.__dict__, "seed": 4})  # rounds 4, 5: the demos used 5
    with pytest.raises(ConfigError, match=r"\[5\]"):
        run_dagger(clash, tmp_path / "run2", progress=False)


def test_rollouts_show_the_actor_its_own_camera(tiny_dir, tmp_path):
    import shutil

    actor = tmp_path / "actor"
    shutil.copytree(tiny_dir, actor)
    (actor / "train_info.json").write_text(json.dumps({"camera": "corner"}))
    demos = tmp_path / "demos.hdf5"
    generate_demos(DemoConfig(("reach-v3",), episodes=1, seed=5, image_size=32, camera="corner"), demos, progress=False)
    cfg = DaggerConfig(init=str(actor), demos=(str(demos),), tasks=("reach-v3",), rounds=1, episodes=1, seed=20,
                       steps=1, batch_size=4, threads=1, max_steps=3)
    final = run_dagger(cfg, tmp_path / "run", progress=False)
    with DemoFile(tmp_path / "run" / "round_1" / "rollouts.hdf5") as f:
        assert f.attrs["env_args"]["camera"] == "corner"
    assert trained_camera(final) == "corner"
