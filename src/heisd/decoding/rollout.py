"""Batched greedy decoding of whole actions: the one offline rollout (datastore payloads,
drafter training features). Online decoding is the `SpeculativeDecoder` loop."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel


@dataclass
class Features:
    hidden: torch.Tensor  # [N, n, d] target lm_head inputs that predicted each greedy action token
    tokens: torch.Tensor  # [N, n] the target's greedy action tokens

    def __len__(self) -> int:
        return len(self.tokens)


@torch.no_grad()
def greedy_rollout(llm: PreTrainedModel, prefix_embeds: torch.Tensor, n_tokens: int) -> Features:
    """Greedy-decode `n_tokens` after each prefix of [B, P, d] (same length, none padded: batches
    are frames of one prompt, `heisd.targets.rollout`)."""
    decoder, lm_head = llm.get_decoder(), llm.get_output_embeddings()
    mask = torch.ones(prefix_embeds.shape[:2], dtype=torch.long, device=prefix_embeds.device)
    positions = mask.cumsum(1) - 1
    cache = DynamicCache(config=llm.config)
    out = decoder(inputs_embeds=prefix_embeds, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
    hidden = [out.last_hidden_state[:, -1]]
    tokens = [lm_head(hidden[-1]).argmax(-1)]
    for _ in range(n_tokens - 1):
        mask = torch.cat([mask, mask.new_ones(len(mask), 1)], 1)
        positions = positions[:, -1:] + 1
        out = decoder(
            input_ids=tokens[-1][:, None], attention_mask=mask, position_ids=positions, cache=cache, use_cache=True
        )
        hidden.append(out.last_hidden_state[:, -1])
        tokens.append(lm_head(hidden[-1]).argmax(-1))
    return Features(torch.stack(hidden, 1), torch.stack(tokens, 1))
