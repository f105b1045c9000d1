"""FiLM: a target whose vision reads the instruction (`VLAConfig.film`, `train-vla --film`)."""

from __future__ import annotations

import json

import pytest
import torch

from heisd.errors import ConfigError
from heisd.targets.vla import VLA
from test_vla import inputs, run_train, tiny_model, write_demos


def perturbed(model: VLA, seed: int = 3) -> VLA:
    """The model with FiLM layers away from zero, as training moves them."""
    model.add_film()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.film.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model


@pytest.mark.parametrize("views", [1, 2], ids=["agentview", "with-wrist"])
def test_film_layers_start_at_zero_and_change_nothing(views):
    plain, film = tiny_model(views=views), tiny_model(views=views)
    film.add_film()
    images, prompt, state, actions = inputs(film)
    with torch.no_grad():
        assert torch.equal(film.teacher_forced(images, prompt, state, actions).logits,
                           plain.teacher_forced(images, prompt, state, actions).logits)
        assert torch.equal(film.retrieval_key(images, state, prompt), plain.retrieval_key(images, state))
    assert film.config.film and film.fingerprint() != plain.fingerprint()


@pytest.mark.parametrize("views", [1, 2], ids=["agentview", "with-wrist"])
def test_film_features_depend_on_the_instruction_and_not_on_prompt_padding(views):
    model = perturbed(tiny_model(views=views))
    model.add_film()  # a model that has them keeps them
    assert model.film[0][1].weight.abs().sum() > 0
    images, prompt, state, actions = inputs(model)
    other = model.encode_prompt("move right").expand(2, -1)
    with torch.no_grad():
        key, other_key = model.retrieval_key(images, state, prompt), model.retrieval_key(images, state, other)
        assert not torch.allclose(key, other_key)
        prefix, same_key = model.encode_observation(images, prompt, state)  # one CNN pass, same values
        torch.testing.assert_close(prefix, model.prefix_embeds(images, prompt, state))
        torch.testing.assert_close(same_key, key)
        plain = model.teacher_forced(images, prompt, state, actions).logits
        padded = torch.cat([torch.zeros(2, 3, dtype=torch.long), prompt], 1)  # pad id 0, left
        mask = torch.cat([torch.zeros(2, 3, dtype=torch.long), torch.ones_like(prompt)], 1)
        torch.testing.assert_close(model.teacher_forced(images, padded, state, actions, mask).logits, plain,
                                   atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"conditioned on the instruction \(FiLM\): pass its prompt ids"):
        model.retrieval_key(images, state)


def test_film_checkpoint_round_trip_and_plain_config_unchanged(tmp_path):
    model = perturbed(tiny_model())
    model.save_pretrained(tmp_path / "film")
    loaded = VLA.from_pretrained(tmp_path / "film")
    images, prompt, state, actions = inputs(model)
    with torch.no_grad():
        assert torch.equal(loaded.teacher_forced(images, prompt, state, actions).logits,
                           model.teacher_forced(images, prompt, state, actions).logits)
    assert loaded.config.film and loaded.fingerprint() == model.fingerprint()
    assert json.loads((tmp_path / "film" / "config.json").read_text())["film"] is True
    tiny_model().save_pretrained(tmp_path / "plain")  # shipped checkpoints keep their configs and fingerprints
    assert "film" not in json.loads((tmp_path / "plain" / "config.json").read_text())
    with pytest.raises(ConfigError, match="FiLM"):
        loaded.use_cuda_graphs()


def test_train_vla_film_new_and_fine_tuned_kept_on_resume(tmp_path, capsys):
    demos = tmp_path / "demos.hdf5"
    write_demos(demos)
    assert run_train(demos, tmp_path / "plain", 10) == 0
    assert not VLA.from_pretrained(tmp_path / "plain").config.film
    assert run_train(demos, tmp_path / "new", 10, extra=("--film",)) == 0
    assert VLA.from_pretrained(tmp_path / "new").config.film
    assert run_train(demos, tmp_path / "tuned", 10, extra=("--film", "--init-from", str(tmp_path / "plain"))) == 0
    tuned = VLA.from_pretrained(tmp_path / "tuned")
    assert tuned.config.film and all(f[1].weight.abs().sum() > 0 for f in tuned.film)  # trained off zero
    assert json.loads((tmp_path / "tuned" / "train_info.json").read_text())["model_config"]["film"] is True
    assert run_train(demos, tmp_path / "tuned", 20, resume=True) == 0  # resumed without the flag: still FiLM
    assert VLA.from_pretrained(tmp_path / "tuned").config.film
    capsys.readouterr()
    assert run_train(demos, tmp_path / "plain", 20, resume=True, extra=("--film",)) == 2
    assert "--film on --resume: the run was started without FiLM" in capsys.readouterr().err
