"""A small real tokenizer for the instruction prompt (byte-level BPE, HF `tokenizers`).

Layout of the base vocabulary: text ids first (id 0 is the pad token), then the action
ids as its LAST `n_bins` ids (see `ActionTokenizer`), so decoding code written for this
target runs unchanged on OpenVLA (action ids 31744..31999 of 32000). Byte-level BPE never
needs an unknown token: an instruction with unseen words still encodes, just into more pieces.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

# OpenVLA's prompt, verbatim
PROMPT_TEMPLATE = "In: What action should the robot take to {instruction}?\nOut:"
PAD_TOKEN = "<pad>"


def format_prompt(instruction: str) -> str:
    return PROMPT_TEMPLATE.format(instruction=instruction.strip().rstrip(".?").lower())


class TextTokenizer:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        pad = tokenizer.token_to_id(PAD_TOKEN)
        if pad is None:
            raise ValueError(f"tokenizer has no {PAD_TOKEN} token")
        self.pad_id = pad

    @classmethod
    def train(cls, instructions: list[str], max_vocab: int = 2048) -> "TextTokenizer":
        """Fit BPE merges on the prompt template filled with every instruction.

        With the corpus this small, merges run until each word is one token; `max_vocab`
        only bounds the pathological case of thousands of distinct instructions.
        """
        if not instructions:
            raise ValueError("no instructions to train the text tokenizer on")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=max_vocab, min_frequency=1, special_tokens=[PAD_TOKEN],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
        )
        tok.train_from_iterator(sorted({format_prompt(i) for i in instructions}), trainer=trainer)
        return cls(tok)

    @classmethod
    def load(cls, path: str | Path) -> "TextTokenizer":
        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as e:  # tokenizers raises a bare Exception on bad JSON
            raise ValueError(f"cannot read text tokenizer {path}: {e}") from e

    def save(self, path: str | Path) -> None:
        self.tokenizer.save(str(path))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode_prompt(self, instruction: str) -> list[int]:
        return self.tokenizer.encode(format_prompt(instruction)).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)
