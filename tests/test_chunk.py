"""Action chunks: `train-vla --chunk` (a new target, a re-chunked fine-tune, kept on resume)."""

from __future__ import annotations

import json

import pytest
import torch

from heisd.targets.vla import VLA, VLAConfig
from heisd.targets.vla.train import _initial_model
from test_vla import TINY, inputs, run_train, tiny_model, write_demos


def test_rechunked_checkpoint_keeps_its_first_action_and_records_the_new_layout(tmp_path):
    source = tiny_model()  # chunk 2: 8 action tokens
    source.save_pretrained(tmp_path / "src")
    longer = _initial_model(tmp_path / "src", 4).eval()
    assert longer.config.chunk == 4 and longer.spec.n_action_tokens == 16
    images, prompt, state, actions = inputs(source)
    more = torch.cat([actions, actions], 1)
    with torch.no_grad():  # causal: the first actions' tokens are predicted as the source predicted them
        torch.testing.assert_close(longer.teacher_forced(images, prompt, state, more).logits[:, :8],
                                   source.teacher_forced(images, prompt, state, actions).logits)
    longer.save_pretrained(tmp_path / "long")
    assert VLA.from_pretrained(tmp_path / "long").config.chunk == 4
    assert json.loads((tmp_path / "src" / "config.json").read_text())["chunk"] == 2


def test_train_vla_chunk_new_fine_tuned_and_kept_on_resume(tmp_path, capsys):
    demos = tmp_path / "demos.hdf5"
    write_demos(demos)
    assert run_train(demos, tmp_path / "plain", 10) == 0
    assert VLA.from_pretrained(tmp_path / "plain").config.chunk == 2  # mw's default
    assert run_train(demos, tmp_path / "new", 10, extra=("--chunk", "3")) == 0
    assert VLA.from_pretrained(tmp_path / "new").config.chunk == 3
    assert run_train(demos, tmp_path / "tuned", 10, extra=("--chunk", "4", "--init-from", str(tmp_path / "plain"))) == 0
    assert json.loads((tmp_path / "tuned" / "train_info.json").read_text())["model_config"]["chunk"] == 4
    assert run_train(demos, tmp_path / "tuned", 20, resume=True) == 0  # resumed without the flag: still 4
    assert VLA.from_pretrained(tmp_path / "tuned").config.chunk == 4
    capsys.readouterr()
    assert run_train(demos, tmp_path / "tuned", 30, resume=True, extra=("--chunk", "2")) == 2
    assert "--chunk 2 on --resume: the run in" in capsys.readouterr().err
    assert run_train(demos, tmp_path / "zero", 10, extra=("--chunk", "0")) == 2
    assert "--chunk must be >= 1 action, got 0" in capsys.readouterr().err
    assert not (tmp_path / "zero").exists()
    for name, init in (("long", ()), ("long_tuned", ("--init-from", str(tmp_path / "plain")))):
        # a chunk too long for the positions: named through `_check_settings` on a new run and a fine-tune
        assert run_train(demos, tmp_path / name, 10, extra=("--chunk", "100", *init)) == 2
        assert "the target's settings are refused" in capsys.readouterr().err
        assert not (tmp_path / name).exists()


def test_a_chunk_that_leaves_no_room_for_the_prompt_is_refused():
    with pytest.raises(ValueError, match="leave no room for the prompt in max_positions 64"):
        VLAConfig(text_vocab_size=10, **{**TINY, "chunk": 12}).validate()
