"""The pieces of one control step, timed on the target as the decode loop runs them.

vision (frame -> prefix embeddings + retrieval key), prefill, the fused prefill (the prefill pass
verifying a retrieval-budget tree, `Verifier.prefill_verify`), one decode step (an empty
tree: what AR does per token), a whole AR step through the decode loop (vision included: what the
pieces' sum should come to), one verification pass over draft trees of several sizes,
one drafter pass and one whole drafter proposal (its passes and its tree choice), one
datastore query and one retrieval proposal (the query and its group tree). Every LLM piece goes through the project's
`Verifier`, and the KV cache is rolled back after each timed pass, so each run sees the
same cache length: the state of a step right after its prefill.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from heisd.decoding import DecodeConfig, DecodeState, DraftTree, SpeculativeDecoder
from heisd.decoding.graphs import make_verifier
from heisd.decoding.vocab import ActionVocab
from heisd.drafter.config import TreeConfig
from heisd.drafter.model import Drafter, DrafterConfig, DrafterTarget
from heisd.drafter.proposer import DrafterProposer
from heisd.profiling.timer import Piece, device_work, measure_rounds
from heisd.retrieval.config import RetrievalConfig
from heisd.retrieval.datastore import Datastore
from heisd.retrieval.proposer import RetrievalProposer
from heisd.targets.base import Target


@dataclass(frozen=True)
class ProfileConfig:
    repeats: int = 20  # timed runs per piece (the median is reported)
    warmup: int = 3  # untimed runs before them
    tree_sizes: tuple[int, ...] = (4, 8, 16, 32, 64)  # draft-tree nodes verified in one pass
    tree_branching: int = 4  # children per node of the profiled trees (filled breadth first)
    instruction: str = "pick up the black bowl and place it on the plate"  # sets the prompt length
    retrieval_k: int = 8  # Top-K of the datastore query
    seed: int = 0  # the random frame
    tree: TreeConfig = TreeConfig()  # the drafter tree a profiled proposal grows (the methods' default)
    # the pieces take turns, each timed in a tight loop of repeats / rounds runs per turn, so a change
    # in machine load (a shared machine) hits all alike; 1: each piece once, start to end
    rounds: int = 10
    device_work: bool = False  # CUDA: also each piece's GPU kernel time and kernel count (`timer.device_work`)
    cuda_graphs: bool = False  # CUDA: the target's passes on a static cache, replayed as CUDA graphs (`StaticVerifier`)


def branching_tree(n: int, branching: int, first_action_id: int, n_bins: int) -> DraftTree:
    """n nodes, each with up to `branching` children, breadth first; action-token drafts."""
    index = torch.arange(n)
    return DraftTree(first_action_id + index % n_bins, index // branching - 1)


def random_drafter(target: Target) -> Drafter:
    """A drafter of the target's EAGLE shape with untrained weights: its cost, not its drafts."""
    spec = target.spec
    bound = DrafterTarget(target.llm, spec.vocab_size, spec.n_bins)
    return Drafter(DrafterConfig.for_target(bound), bound).eval()


@torch.inference_mode()
def profile_target(target: Target, config: ProfileConfig, drafter: Drafter | None = None,
                   datastore: Datastore | None = None) -> dict[str, Any]:
    spec, llm = target.spec, target.llm
    device = llm.device
    rng = np.random.default_rng(config.seed)
    frame = torch.from_numpy(rng.integers(0, 256, (1, *spec.frame_shape), dtype=np.uint8))
    state = spec.state_input(np.zeros((1, spec.state_dim)))
    prompt = target.encode_prompt(config.instruction)

    verifier = make_verifier(target, config.cuda_graphs)
    work: dict[str, Piece] = {"vision": (lambda: target.encode_observation(frame, prompt, state), None)}
    prefix, key = target.encode_observation(frame, prompt, state)
    work["prefill"] = (lambda: verifier.prefill(prefix), None)
    pre = verifier.prefill(prefix)
    root = [pre.token]
    first_action = ActionVocab(spec.vocab_size, spec.n_bins).first_id
    fused = branching_tree(RetrievalConfig.node_budget, config.tree_branching, first_action, spec.n_bins)
    # every timed pass is rolled back after it; a static-cache verifier's prefills refill one cache
    # (the same prefix, so the same rows), and the fused one leaves its tree's rows to roll back
    work["fused_prefill"] = (lambda: verifier.prefill_verify(prefix, fused),
                             lambda done: verifier.rollback(done[0].cache, len(fused)))
    work["decode_step"] = (lambda: verifier.verify(pre.cache, root, DraftTree.empty()),
                           lambda _: verifier.rollback(pre.cache, 1))
    for n in config.tree_sizes:
        tree = branching_tree(n, config.tree_branching, first_action, spec.n_bins)
        work[f"tree_verify/{n}"] = (lambda tree=tree: verifier.verify(pre.cache, root, tree),
                                    lambda _, n=n: verifier.rollback(pre.cache, 1 + n))
    # a whole AR control step as `eval --method ar` runs it (vision, then the decode loop's prefill and
    # decode steps): the measured counterpart of the pieces' sum; its prefill refills a static cache
    ar = SpeculativeDecoder(verifier, DecodeConfig(spec.n_action_tokens, spec.vocab_size, spec.n_bins))
    work["ar_step"] = (lambda: ar.decode(target.encode_observation(frame, prompt, state)[0]),
                       lambda _: verifier.rollback(pre.cache, verifier.cache_length(pre.cache) - prefix.shape[1]))
    # the step right after its prefill, as the proposers see it
    after_prefill = DecodeState(list(root), spec.n_action_tokens, pre.hidden[None], pre.hidden, verifier, pre.cache, {})
    if drafter is not None:
        dev = drafter.fc.weight.device
        features = pre.hidden[None, None].to(dev)
        tokens, positions = torch.tensor([root], device=dev), torch.zeros(1, 1, dtype=torch.long, device=dev)
        drafting = DrafterProposer(drafter, config.tree, cuda_graphs=config.cuda_graphs, n_tokens=spec.n_action_tokens)
        passes, seen = drafting.passes, torch.ones(1, 1, dtype=torch.bool)
        # the first pass of a proposal: one drafter layer over the action context, fresh cache
        work["drafter_pass"] = (lambda: (passes.start(), passes.run(features, tokens, positions, seen)), None)
        # a whole proposal as the decode loop asks for one: a pass per level plus choosing the tree
        work["drafter_proposal"] = (lambda: (drafting.begin_step({}), drafting.propose(after_prefill)), None)
    if datastore is not None:
        if datastore.key_dim != key.shape[1]:
            raise ValueError(f"datastore {datastore.root} has {datastore.key_dim}-d keys, "
                             f"this target's are {key.shape[1]}-d")
        query = key[0].float().cpu().numpy()
        work["datastore_query"] = (lambda: datastore.query(query, None, config.retrieval_k), None)
        # a retrieval step's first proposal: the query and its group tree
        layout = RetrievalConfig.for_action(spec.action_dim, spec.chunk, k=config.retrieval_k)
        retrieving = RetrievalProposer(datastore, layout, vocab=ActionVocab(spec.vocab_size, spec.n_bins))
        step = {"key": query, "task": None}
        work["retrieval_proposal"] = (lambda: (retrieving.begin_step(step), retrieving.propose(after_prefill)), None)
    timings = measure_rounds(work, device, config.repeats, config.warmup, min(config.rounds, config.repeats))
    gpu = device_work(work, device) if config.device_work else {}
    if verifier.cache_length(pre.cache) != prefix.shape[1]:  # every timed pass must have been rolled back
        raise RuntimeError(f"KV cache holds {verifier.cache_length(pre.cache)} positions after profiling, "
                           f"not {prefix.shape[1]}")
    pieces: dict[str, Any] = {"tree_verify": {}}
    for name, timing in timings.items():
        entry = {**timing.to_dict(), **(gpu[name].to_dict() if name in gpu else {})}
        if name.startswith("tree_verify/"):
            pieces["tree_verify"][name.split("/")[1]] = entry
        else:
            pieces[name] = entry
    return {
        "spec": asdict(spec), "prefix_len": int(prefix.shape[1]), "key_dim": int(key.shape[1]),
        "llm_parameters": sum(p.numel() for p in llm.parameters()),
        "tree_shape": f"{config.tree_branching}-ary, breadth first, action-token drafts",
        "fused_prefill_nodes": RetrievalConfig.node_budget,
        "drafter_tree": asdict(config.tree),
        "repeats": config.repeats, "warmup": config.warmup, "rounds": min(config.rounds, config.repeats),
        "cuda_graphs": config.cuda_graphs,
        "pieces_ms": pieces,
    }
