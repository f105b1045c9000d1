"""A stand-in for the Llama-2 tokenizer (which cannot be downloaded here), of the same kind.

Files `AutoTokenizer` loads as a `LlamaTokenizer`, laid out as Llama-2's tokenizer.json:
BPE with byte fallback, ids 0-2 = <unk> <s> </s>, ids 3-258 = the 256 byte pieces
(so "\\n" is <0x0A> = 13 as in Llama), then pieces learned from robot instructions, then
unused pieces up to 32000 ids with the "▁" empty piece at 29871 as in Llama, and OpenVLA's
added <PAD> = 32000. Action ids are therefore 31744-31999, as in the real tokenizer. The
loader reads every id it needs back from the files, never assumes one (tests move "▁").
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from heisd.targets.openvla.prompt import EMPTY_PIECE, openvla_prompt

BASE_VOCAB = 32000  # Llama-2's vocabulary size
EMPTY_PIECE_ID = 29871  # where Llama-2 has "▁"
PAD_TOKEN = "<PAD>"  # OpenVLA adds it as id 32000
SPECIALS = ("<unk>", "<s>", "</s>")
_INSTRUCTIONS = (  # the corpus the pieces are learned from: LIBERO- and Meta-World-like instructions
    "pick up the black bowl between the plate and the ramekin and place it on the plate",
    "put both the alphabet soup and the tomato sauce in the basket",
    "open the middle drawer of the cabinet", "put the bowl on the stove", "turn on the stove",
    "put the wine bottle on top of the cabinet", "push the plate to the front of the stove",
    "put the cream cheese in the bowl", "pick up the ketchup and place it in the basket",
    "close the top drawer of the cabinet", "put the mug in the microwave and close it",
    "reach the red goal", "push the puck to the goal", "pick up the puck and place it at the goal",
    "open the drawer", "stack the left bowl on the right bowl", "move the can to the left of the box",
)


def _learned_pieces(max_pieces: int) -> tuple[list[str], list[tuple[str, str]]]:
    trainer_tok = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_tok.normalizer = _normalizer()
    # learn within words (each starts with "▁"), keeping punctuation and newlines apart as Llama does
    trainer_tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(EMPTY_PIECE, behavior="merged_with_next"), pre_tokenizers.Punctuation(),
        pre_tokenizers.Split("\n", behavior="isolated")])
    trainer = trainers.BpeTrainer(vocab_size=max_pieces, special_tokens=list(SPECIALS), show_progress=False)
    trainer_tok.train_from_iterator([openvla_prompt(i) for i in _INSTRUCTIONS], trainer=trainer)
    model = json.loads(trainer_tok.to_str())["model"]
    # control characters go through the byte pieces, as in Llama
    pieces = [p for p in model["vocab"] if p not in SPECIALS and p.isprintable()]
    merges = [tuple(m) for m in model["merges"] if all(part.isprintable() for part in m)]
    return pieces, merges


def _normalizer() -> normalizers.Normalizer:
    return normalizers.Sequence([normalizers.Prepend(EMPTY_PIECE), normalizers.Replace(" ", EMPTY_PIECE)])


def build_standin_tokenizer(empty_piece_id: int = EMPTY_PIECE_ID) -> Tokenizer:
    pieces, merges = _learned_pieces(max_pieces=1024)
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    vocab.update({f"<0x{b:02X}>": len(SPECIALS) + b for b in range(256)})
    for piece in pieces:
        if piece != EMPTY_PIECE:
            vocab.setdefault(piece, len(vocab))
    if not len(vocab) <= empty_piece_id < BASE_VOCAB:
        raise ValueError(f"empty_piece_id must be in [{len(vocab)}, {BASE_VOCAB}), got {empty_piece_id}")
    unused = 0
    while len(vocab) < BASE_VOCAB:  # never produced: no merge leads to them
        if len(vocab) == empty_piece_id:
            vocab[EMPTY_PIECE] = empty_piece_id
        else:
            vocab[f"<unused{unused}>"] = len(vocab)
            unused += 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = _normalizer()
    tok.decoder = decoders.Sequence([decoders.Replace(EMPTY_PIECE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (*SPECIALS, PAD_TOKEN)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", vocab["<s>"])])
    return tok


def save_standin_tokenizer(directory: Path, empty_piece_id: int = EMPTY_PIECE_ID) -> None:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json, as OpenVLA's checkpoints hold them."""
    data = json.loads(build_standin_tokenizer(empty_piece_id).to_str())
    # merges as "a b" strings, as Llama-2's file has them (older tokenizers read nothing else)
    data["model"]["merges"] = [" ".join(pair) for pair in data["model"]["merges"]]
    (directory / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": PAD_TOKEN}
    config = {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False, "legacy": False,
              "model_max_length": 2048, "padding_side": "right", "clean_up_tokenization_spaces": False, **specials}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (directory / "special_tokens_map.json").write_text(json.dumps(specials, indent=2))
