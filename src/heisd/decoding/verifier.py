"""The target model seen as a verifier: prefill, one tree pass, KV compaction.

Every target forward of the decode loop goes through here, so ``target_forwards`` is
counted in one place (the loop) and every pass has the same shape: context tokens the
target has not processed yet (the *roots*, usually just the last emitted token) as a
causal chain, then a draft tree hanging below the last root. The prefill itself can carry a
tree (`prefill_verify`): a draft known before the target runs is verified in the prefill pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
from transformers import Cache, DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from heisd.decoding.tree import DraftTree
from heisd.errors import ConfigError, NonFiniteError


@dataclass
class Prefill:
    cache: Cache  # KV of the prefix only
    token: int  # the target's greedy first token
    hidden: torch.Tensor  # [d] lm_head input at the last prefix position (it predicted ``token``)


@dataclass
class Verification:
    past_len: int  # cache length before the roots (a fused prefill: its prefix length - 1)
    n_roots: int  # context tokens fed before the tree (>= 1; a fused prefill: its last prefix position)
    next_tokens: torch.Tensor  # LongTensor [R+N]: target greedy next token per slot (roots, then nodes)
    hidden: torch.Tensor  # [R+N, d]: lm_head input per slot
    margins: torch.Tensor | None = None  # [R+N]: top-1 minus top-2 logit per slot (`verify(margins=True)`)

    @property
    def tree_next(self) -> torch.Tensor:
        """[N+1]: greedy next token after the last root (index 0) and after each node (i+1)."""
        return self.next_tokens[self.n_roots - 1 :]

    @property
    def tree_margins(self) -> torch.Tensor | None:
        """[N+1]: the target's top-token margins in `tree_next`'s layout (None: not computed)."""
        return None if self.margins is None else self.margins[self.n_roots - 1 :]


class Verifier:
    """Wraps a Hugging Face causal LM (LlamaForCausalLM) fed by ``inputs_embeds`` for its prefix."""

    def __init__(self, model: PreTrainedModel):
        self.model = model.eval()
        # Decoder and lm_head are called separately: the decoder's output (after the final
        # norm) is the lm_head input the drafter and verify-skip need, and the lm_head runs
        # only on the rows we want (the prefill's ``logits_to_keep=1``).
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()

    @property
    def device(self) -> torch.device:
        return self.model.device

    @torch.no_grad()
    def prefill(self, prefix_embeds: torch.Tensor, label: str = "its prefill pass") -> Prefill:
        """`label` names the pass in the error raised when its logits are not finite."""
        if prefix_embeds.dim() != 3 or prefix_embeds.shape[0] != 1:
            raise ValueError(f"prefix_embeds must be [1, P, d], got {tuple(prefix_embeds.shape)}")
        cache = self._new_cache()
        out = self.decoder(inputs_embeds=prefix_embeds, cache=cache, use_cache=True)
        hidden = out.last_hidden_state[0, -1]
        token = int(self._greedy(self.lm_head(hidden), label))
        return Prefill(cache=cache, token=token, hidden=hidden)

    @torch.no_grad()
    def prefill_verify(
        self, prefix_embeds: torch.Tensor, tree: DraftTree, label: str = "its prefill pass", margins: bool = False
    ) -> tuple[Prefill, Verification]:
        """ONE target forward over [prefix, tree nodes]: the prefill and the verification of a draft of
        the whole action (its first tokens hang below the last prefix position) in the same pass, so a
        draft known before the prefill (retrieval's, from the vision key) costs no pass of its own.

        The Verification reads like `verify`'s with the last prefix position as its single root:
        ``past_len`` is the prefix length minus one, and `commit` keeps the prefix and the accepted path.
        """
        if prefix_embeds.dim() != 3 or prefix_embeds.shape[0] != 1:
            raise ValueError(f"prefix_embeds must be [1, P, d], got {tuple(prefix_embeds.shape)}")
        cache = self._new_cache()
        n_prefix = prefix_embeds.shape[1]
        nodes = self.model.get_input_embeddings()(tree.tokens.to(self.device))[None].to(prefix_embeds.dtype)
        verification = self._tree_pass(
            cache, torch.cat([prefix_embeds, nodes], dim=1), n_prefix, tree, label, margins, embeds=True
        )
        prefill = Prefill(cache=cache, token=int(verification.tree_next[0]), hidden=verification.hidden[0])
        return prefill, verification

    @torch.no_grad()
    def verify(
        self,
        cache: Cache,
        roots: int | Sequence[int],
        tree: DraftTree,
        label: str = "a verify pass",
        margins: bool = False,
    ) -> Verification:
        """ONE target forward over [roots, tree nodes] on top of ``cache`` (which it extends).
        ``margins``: also return each slot's top-1 minus top-2 logit (the target's confidence)."""
        roots = [roots] if isinstance(roots, int) else list(roots)
        if not roots:
            raise ValueError("verify needs at least one root token")
        ids = torch.cat([torch.tensor(roots, dtype=torch.long), tree.tokens]).to(self.device)
        return self._tree_pass(cache, ids[None], len(roots), tree, label, margins)

    def _tree_pass(
        self,
        cache: Cache,
        inputs: torch.Tensor,
        n_roots: int,
        tree: DraftTree,
        label: str,
        margins: bool,
        embeds: bool = False,
    ) -> Verification:
        """One forward over [roots, tree nodes] (ids [1, R+N], or embeddings [1, R+N, d] with ``embeds``)
        on top of ``cache``. Token roots keep a row each; embedding roots (a prefix) keep only their
        last, the one whose next token starts the action: the lm_head never runs on the others."""
        past_len = self.cache_length(cache)
        positions = torch.cat([torch.arange(n_roots), n_roots - 1 + tree.depth]) + past_len
        kept = n_roots - 1 if embeds else 0
        hidden, tokens, top = self._forward(
            cache, inputs, embeds, self._attention_mask(n_roots, tree, past_len), positions[None], kept, margins
        )
        _check_finite(top[:, 0], label)
        past_len, n_roots = past_len + kept, n_roots - kept
        if not margins:
            return Verification(past_len, n_roots, tokens, hidden)
        return Verification(past_len, n_roots, tokens, hidden, top[:, 0] - top[:, 1])

    def _forward(
        self,
        cache: Cache,
        inputs: torch.Tensor,
        embeds: bool,
        mask: torch.Tensor,
        positions: torch.Tensor,
        kept: int,
        margins: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The target's forward on top of ``cache`` (which it extends): (lm_head inputs of rows ``kept:``,
        their greedy tokens on the CPU, their top logit, or top two with ``margins``, as float32 on the CPU)."""
        out = self.decoder(
            **{"inputs_embeds" if embeds else "input_ids": inputs},
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            cache=cache,
            use_cache=True,
        )
        hidden = out.last_hidden_state[0, kept:]
        logits = self.lm_head(hidden)
        tokens = logits.argmax(-1)
        top = logits.topk(2, dim=-1).values if margins else logits.gather(-1, tokens.unsqueeze(-1))
        return hidden, tokens.cpu(), top.float().cpu()

    def _new_cache(self) -> Cache:
        """An empty KV cache for a prefill."""
        cache = DynamicCache(config=self.model.config)
        check_cache(cache)
        return cache

    def cache_length(self, cache: Cache) -> int:
        """Positions ``cache`` holds."""
        return cache.get_seq_length()

    def rollback(self, cache: Cache, n: int) -> None:
        """Forget the last ``n`` positions of ``cache`` (a pass that is not committed, e.g. a timed one)."""
        if n:
            cache.crop(-n)

    @staticmethod
    def _greedy(logits: torch.Tensor, label: str) -> torch.Tensor:
        """argmax over the last dim, on the CPU; refused when a greedy token's logit is NaN or inf."""
        tokens = logits.argmax(-1)
        _check_finite(logits.gather(-1, tokens.unsqueeze(-1)).cpu(), label)
        return tokens.cpu()

    def _attention_mask(self, n_roots: int, tree: DraftTree, past_len: int) -> torch.Tensor:
        # Additive float mask (0 / finfo.min), shape (1, 1, q, kv): transformers passes a 4-D mask
        # through unchanged, and a bool one is silently wrong with eager attention. kv is past+q
        # here; a static cache's columns past that stay masked.
        q = n_roots + len(tree)
        allowed = torch.zeros(q, q, dtype=torch.bool)
        allowed[:n_roots, :n_roots] = torch.ones(n_roots, n_roots, dtype=torch.bool).tril()
        allowed[n_roots:, : n_roots - 1] = True  # every node sees all roots
        allowed[n_roots - 1 :, n_roots - 1 :] = tree.ancestor_mask()
        dtype = self.model.dtype
        mask = torch.full((1, 1, q, self._kv_length(past_len + q)), torch.finfo(dtype).min, dtype=dtype)
        mask[0, 0, :, :past_len] = 0
        mask[0, 0, :, past_len : past_len + q].masked_fill_(allowed, 0)
        return mask

    def _kv_length(self, length: int) -> int:
        """Key columns of a pass's mask when the cache holds ``length`` positions after it."""
        return length

    def commit(self, cache: Cache, verification: Verification, accepted_nodes: Sequence[int]) -> None:
        """Keep in the cache only the prefix, the roots and the accepted path, in place (EAGLE's
        way): the accepted nodes' rows move up behind the roots, then the tail is cut off. Only
        those rows are copied, never the prefix (~300 positions x 32 layers at OpenVLA-7B). `cache`
        is one `prefill` made, whose layers were checked there (`check_cache`)."""
        start = verification.past_len + verification.n_roots
        nodes = torch.as_tensor(list(accepted_nodes), dtype=torch.long)
        kept = len(nodes)
        if not torch.equal(nodes, torch.arange(kept)):  # a leading chain is already in place
            # a path's node indices increase with depth, so row i moves from start + nodes[i] to
            # start + i (never down); the right side is gathered before it is written
            source, target = start + nodes, start + torch.arange(kept)
            for layer in cache.layers:
                keys, values = cast(DynamicLayer, layer).keys, cast(DynamicLayer, layer).values
                assert keys is not None and values is not None  # filled by the pass being committed
                src, dst = source.to(keys.device), target.to(keys.device)
                keys[:, :, dst] = keys[:, :, src]
                values[:, :, dst] = values[:, :, src]
        self.rollback(cache, self.cache_length(cache) - start - kept)


def _check_finite(top: torch.Tensor, label: str) -> None:
    """Refuse a pass whose greedy logits (``top``, one per row) hold NaN or inf.

    argmax picks a NaN or +inf wherever a row holds one, so checking the chosen logits
    ([rows] values copied with the tokens, no extra pass over the vocabulary) catches every
    row whose greedy token is garbage; NaN weights would otherwise decode to one
    edge-of-range action every step.
    """
    if not bool(torch.isfinite(top).all()):
        raise NonFiniteError(
            f"the target produced non-finite logits (NaN/inf) in {label}: its weights "
            "hold NaN/inf or its activations overflow the dtype (try --dtype float32)"
        )


def check_cache(cache: DynamicCache) -> None:
    """The verifier rolls back and compacts KV rows by position, which only a plain dynamic layer
    (every position kept, unquantized, unbounded) can take: a sliding window, static, quantized
    or offloaded layer would be silently corrupted, so it is refused."""
    kinds = sorted({type(layer).__name__ for layer in cache.layers if type(layer) is not DynamicLayer})
    if kinds:
        raise ConfigError(
            f"the target's KV cache has {', '.join(kinds)} layers; heisd's tree verification "
            "commits into plain DynamicLayer caches only (no sliding window, static or quantized "
            "cache): load the model without them"
        )
