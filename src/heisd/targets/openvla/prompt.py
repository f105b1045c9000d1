"""OpenVLA's prompt: the template, the tokenizer's BOS, and the empty piece appended after "Out:".

`predict_action` appends token 29871 when the prompt does not end with it: that is the
Llama tokenizer's "▁" piece (SentencePiece's word-start mark alone). Both ids are read
from the checkpoint's own tokenizer, so a checkpoint with another tokenizer gets its own.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedConfig, PreTrainedTokenizerBase

from heisd.targets.vla.checkpoint import CheckpointError

PROMPT_TEMPLATE = "In: What action should the robot take to {instruction}?\nOut:"  # OpenVLA's, verbatim
EMPTY_PIECE = "\u2581"  # SentencePiece's "▁"


def openvla_prompt(instruction: str) -> str:
    return PROMPT_TEMPLATE.format(instruction=instruction.lower())


class PromptEncoder:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, where: Path | str = "tokenizer"):
        self.tokenizer = tokenizer
        bos = tokenizer.bos_token_id
        empty = tokenizer.convert_tokens_to_ids(EMPTY_PIECE)
        if bos is None:
            raise CheckpointError(f"{where}: the tokenizer has no BOS token")
        if empty is None or empty == tokenizer.unk_token_id:
            raise CheckpointError(f"{where}: the tokenizer has no {EMPTY_PIECE!r} piece "
                                  f"(OpenVLA appends it to prompts)")
        self.bos_id, self.empty_id = int(bos), int(empty)
        pad = tokenizer.pad_token_id  # OpenVLA adds <PAD>; without one, pads are masked out anyway
        self.pad_id = int(pad) if pad is not None else self.bos_id

    @classmethod
    def from_dir(cls, directory: Path) -> PromptEncoder:
        try:
            # a neutral config: the tokenizer class comes from tokenizer_config.json, and transformers
            # does not know config.json's model_type "openvla"
            tokenizer = AutoTokenizer.from_pretrained(str(directory), config=PreTrainedConfig())
        except (OSError, ValueError, KeyError) as e:
            raise CheckpointError(f"cannot load the tokenizer of {directory}: {e}") from e
        return cls(tokenizer, directory)

    def encode(self, instruction: str) -> list[int]:
        ids = list(self.tokenizer(openvla_prompt(instruction)).input_ids)
        if not ids or ids[0] != self.bos_id:
            raise CheckpointError("the tokenizer does not start prompts with BOS (add_bos_token is off?)")
        return ids if ids[-1] == self.empty_id else ids + [self.empty_id]

    def encode_tensor(self, instruction: str) -> torch.Tensor:
        return torch.tensor([self.encode(instruction)], dtype=torch.long)
