"""The target VLA as a robot policy: `reset()`, then `act(obs)` per control step (LeRobot-style).

One control step = vision + prefill + decoding of one action chunk with the method's decoder.
The step's record carries every number docs/design.md §4.1 defines, measured here, in one place.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from heisd.decoding.loop import METRIC
from heisd.errors import InputError, NonFiniteError
from heisd.kinematics import TrajectoryTracker
from heisd.runtime.methods import Decoders, MethodConfig, build_decoders
from heisd.runtime.options import OptionRecorder, fallback_of
from heisd.targets import Target


@dataclass
class StepRecord:
    tokens: list[int]  # emitted action tokens
    latency_ms: float  # observation in -> action out
    breakdown_ms: dict[str, float]  # vision, prefill, retrieval, draft, verify, other
    target_forwards: int  # prefill included
    tokens_per_forward: float  # action tokens per target forward (a step with none counts n)
    # where the kinematic window's positions came from: "ee_pos" (given), "state" (its first three
    # values), "integrated" (the emitted delta actions, `Decoders.delta_scale`), None (no switch)
    ee_source: str | None
    accepted: list[int]  # accepted draft tokens per verify pass
    draft_depths: list[int]  # depth of the tree each verify pass checked (0: a plain AR pass)
    skipped: bool  # retrieval draft accepted with no verify pass
    mode: str  # "retrieval" or "drafter" (ar/specvla run in drafter mode)
    metric: float | None  # kinematic F of this step (heisd), None before w positions
    deviation: int  # summed bin deviation of accepted drafts from the target's greedy tokens
    decode_ms: float = 0.0  # the decode loop's own time (prefill + draft + verify + bookkeeping)
    expected_ms: float | None = None  # the switch's prediction of decode_ms (cost-aware switch only)
    choices: list = field(default_factory=list)  # CostChoice of the fallback and tree rules this step
    draft_sizes: list[int] = field(default_factory=list)  # draft tokens each verify pass checked (0: a plain AR pass)
    # retrieval's fallback: [its verify passes, the tokens it emitted] (a list: a record round-trips through JSON)
    fallback: list[int] = field(default_factory=lambda: [0, 0])
    options: dict | None = None  # what the other modes and fallbacks would have done (`OptionRecorder`), untimed

    def as_dict(self) -> dict:
        """The record as plain values (what the servers send): `dataclasses.asdict`'s result, built
        without its recursive deep copy (a tenth of a millisecond per served step)."""
        return {**vars(self), "tokens": list(self.tokens), "breakdown_ms": dict(self.breakdown_ms),
                "choices": [dict(vars(c)) for c in self.choices]}


@dataclass
class VLAPolicy:
    target: Target  # the small VLA or OpenVLA
    decoders: Decoders
    # records, after each step and outside its latency, what every option of the cost rules would have
    # done on the same frame (`heisd bench --record-options`; `heisd project` re-decides with it)
    recorder: OptionRecorder | None = None
    instruction: str = ""
    task: str | None = None
    _prompt: torch.Tensor | None = field(default=None, repr=False)
    _tracker: TrajectoryTracker | None = field(default=None, repr=False)
    _previous: list[int] | None = field(default=None, repr=False)  # the last step's action tokens
    _step: int = field(default=0, repr=False)  # control steps of this episode so far (names a failing one)
    _emitted: np.ndarray | None = field(default=None, repr=False)  # the last step's actions [chunk, action_dim]

    @property
    def views(self) -> int:
        """The cameras `act` reads, stacked in one frame (`heisd.data.views`)."""
        return self.target.spec.views

    def reset(self, instruction: str, task: str | None = None) -> None:
        """New episode: encode the prompt once, forget per-episode decoder state."""
        self.instruction, self.task = instruction, task
        self._prompt = self.target.encode_prompt(instruction)
        self._previous = None
        self._emitted = None
        self._step = 0
        for decoder in self.decoders.by_mode.values():
            decoder.reset()
        switch = self.decoders.switch
        self._tracker = switch.make_tracker(self.decoders.delta_scale) if switch is not None else None

    def end_episode(self, success: bool | None) -> None:
        """Adaptive verify-skip learns from task outcomes (docs/design.md §2.5), in memory; None
        (outcome unknown) teaches nothing."""
        if success is None:
            return
        for skip in self.skip_thresholds():
            skip.update(success)

    def skip_thresholds(self) -> list:
        """The adaptive thresholds (verify-skip, prefill skip) this policy's method uses."""
        retrieval = self.decoders.retrieval
        if retrieval is None:
            return []
        return [skip for skip in (retrieval.verify_skip, retrieval.prefill_skip) if skip is not None]

    @torch.inference_mode()
    def act(self, image: np.ndarray, state: np.ndarray,
            ee_path: Sequence[np.ndarray] | np.ndarray | None = None) -> tuple[np.ndarray, StepRecord]:
        """uint8 image [H, W, 3] + recorded state [S] -> actions [chunk, action_dim] and the step record.

        `ee_path`: the end-effector positions reached since the previous call, one per executed
        environment step, latest last (a single [3] position is one step; default ``state[:3]``).
        The kinematic window counts environment steps, as its statistics from the demonstrations do.
        """
        if self._prompt is None:
            raise RuntimeError("call reset(instruction) before act()")
        t0 = time.perf_counter()
        mode, metric, expected, ee_source = self._mode(ee_path, state)
        switch = self.decoders.switch
        image = np.ascontiguousarray(image)
        if not image.flags.writeable:  # e.g. a frame decoded from a request: torch wants its own buffer
            image = image.copy()
        images = torch.from_numpy(image)[None]
        spec = self.target.spec
        prefix, key = self.target.encode_observation(images, self._prompt, spec.state_input(state[None]))
        # proposers may read the previous action (Jacobi's warm start, the skips' gripper guard)
        context = {"key": key[0].float().cpu().numpy(), "task": self.task, "previous_action": self._previous}
        decoder = self.decoders.by_mode[mode]
        if decoder.acceptance.needs_metric:  # a phase-aware tolerance reads F, computed here if the switch did not
            context[METRIC] = metric if metric is not None or self._tracker is None else self._tracker.fused()
        t1 = time.perf_counter()
        step, self._step = self._step, self._step + 1
        try:
            if not np.isfinite(context["key"]).all():  # a prefill skip would act on it with no target pass
                raise NonFiniteError("the target's vision pass produced a non-finite retrieval key (NaN/inf)")
            result = decoder.decode(prefix, context)
        except NonFiniteError as err:  # stop the episode here rather than emit a garbage action
            raise NonFiniteError(f"control step {step} of the episode ({mode} mode): {err}") from err
        self._previous = list(result.tokens)
        if switch is not None:
            switch.observe(mode, metric, result)
        actions = self.target.action_tokenizer.decode(np.asarray(result.tokens).reshape(spec.chunk, spec.action_dim))
        self._emitted = actions  # integrated next step if no position comes then (the chunk is executed)
        t2 = time.perf_counter()
        # retrieval's query time is part of the loop's draft time: report it on its own
        retrieval_ms = getattr(result.proposer_stats, "retrieval_ms", 0.0)
        timing = result.timing
        breakdown = {
            "vision": (t1 - t0) * 1e3,
            "prefill": timing.prefill_ms,
            "retrieval": retrieval_ms,
            "draft": max(timing.draft_ms - retrieval_ms, 0.0),
            "verify": timing.verify_ms,
            # loop bookkeeping + token -> action decoding: the pieces add up to latency_ms
            "other": (t2 - t1) * 1e3 - timing.prefill_ms - timing.draft_ms - timing.verify_ms,
        }
        record = StepRecord(
            tokens=list(result.tokens), latency_ms=(t2 - t0) * 1e3, breakdown_ms=breakdown,
            target_forwards=result.target_forwards, tokens_per_forward=result.tokens_per_forward,
            accepted=list(result.accepted_lengths), draft_depths=list(result.draft_depths),
            ee_source=ee_source, skipped=result.skipped_tokens > 0, mode=mode, metric=metric,
            deviation=result.deviation,
            decode_ms=timing.prefill_ms + timing.draft_ms + timing.verify_ms + timing.other_ms, expected_ms=expected,
            choices=list(getattr(result.proposer_stats, "choices", [])), draft_sizes=list(result.draft_sizes),
            fallback=list(fallback_of(result)),
        )
        if self.recorder is not None:  # after the step's clock stopped: the shadow decodes are not its latency
            record.options = self.recorder.record(prefix, context, mode, result, self._tracker)
        return actions, record

    def _mode(self, ee_path, state: np.ndarray) -> tuple[str, float | None, float | None, str | None]:
        """(mode, F, the switch's expected decode ms, where the positions came from) of this step."""
        switch, tracker = self.decoders.switch, self._tracker
        if switch is None or tracker is None:
            return self.decoders.fixed_mode, None, None, None
        source = self.ee_source(ee_path is not None, len(state))
        if source == "integrated":  # OpenVLA and its clients send no robot state
            for action in [] if self._emitted is None else self._emitted.tolist():
                tracker.update(delta=action)
        else:
            path = np.asarray(ee_path if ee_path is not None else state[:3], dtype=np.float64).reshape(-1, 3)
            for ee_pos in path.tolist():  # plain floats: the tracker's update is per env step
                tracker.update(ee_pos=ee_pos)
        return (*switch.mode(tracker), source)

    def ee_source(self, has_ee_pos: bool, state_size: int) -> str:
        """Where a step's end-effector positions come from: the given path, the state's first three
        values, else the emitted delta actions integrated (`InputError` when the switch cannot)."""
        if has_ee_pos:
            return "ee_pos"
        if state_size >= 3:
            return "state"
        if self.decoders.delta_scale is None:
            raise InputError("the kinematic switch needs end-effector positions: send ee_pos (or a state whose "
                             "first three values are the position); this datastore has no delta action scale to "
                             "integrate the actions with (rebuild it with build-datastore)")
        return "integrated"


class PolicyPool:
    """Builds `VLAPolicy`s of one target and method that share what is read-only: the datastore (one
    index in memory) and the drafter module (one copy of its weights: at 7B scale a drafter layer
    per policy would add up). Each policy has its own proposers, switch and kinematic window, so
    episodes decode independently; they must run one step at a time (one thread, or a model worker).
    The first policy is built at once, so a wrong drafter or datastore fails here."""

    def __init__(self, target, method: MethodConfig):
        self.target, self.method = target, method
        self.first = VLAPolicy(target, build_decoders(method, target))
        retrieval = self.first.decoders.retrieval
        self.datastore = None if retrieval is None else retrieval.datastore
        self.drafter = self.first.decoders.drafter
        self._handed_first = False

    def make(self) -> VLAPolicy:
        """A policy ready for `reset()`: the first one built, then new ones on the shared parts."""
        if not self._handed_first:
            self._handed_first = True
            return self.first
        return VLAPolicy(self.target, build_decoders(self.method, self.target, self.datastore, self.drafter))
