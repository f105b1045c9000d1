"""`heisd train-vla`: behaviour-clone the target VLA on demonstration files."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = ("Train a target on demonstrations: heisd's small VLA (CNN + Llama, OpenVLA action tokens) or, with "
        "--arch openvla, OpenVLA's architecture at a small shape, saved in OpenVLA's file layout.")

# default actions per inference: Meta-World 2 x 4 dims = 8 tokens (close to OpenVLA's 7); LIBERO 1 x 7, as OpenVLA
CHUNK = {"mw": 2, "libero": 1}
ACTION_BOUNDS = ("quantile", "absmax")  # heisd.data.dataset.ACTION_BOUNDS (not imported: --help stays light)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--benchmark", choices=sorted(CHUNK), default="mw",
                        help="sets the default action chunk (mw: 2 actions x 4 dims = 8 tokens; libero: 1 x 7)")
    parser.add_argument("--chunk", type=int, default=None,
                        help="vla: actions predicted per inference, executed open loop (default: the benchmark's, "
                             "mw 2, libero 1; OpenVLA-OFT predicts 8 on LIBERO). --init-from a checkpoint with "
                             "another chunk re-chunks it: its tokenizers and bins carry over and it learns the "
                             "longer action sequence. Kept on --resume")
    parser.add_argument("--arch", choices=("vla", "openvla"), default="vla",
                        help="vla: heisd's small target; openvla: OpenVLA's fused ViTs, projector and Llama at the "
                             "'small' shape (256 px LIBERO demonstrations with --shadows, through OpenVLA's frame "
                             "pipeline; the checkpoint loads through the native OpenVLA loader)")
    parser.add_argument("--demos", type=Path, nargs="+", required=True, help="HDF5 demonstration files")
    parser.add_argument("--out", type=Path, required=True, help="checkpoint directory")
    parser.add_argument("--steps", type=int, default=8000,
                        help="total optimizer steps; it also sets the cosine schedule, so keep it on --resume")
    parser.add_argument("--batch-size", type=int, default=64, help="frames per step")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak AdamW learning rate")
    parser.add_argument("--warmup-steps", type=int, default=200, help="linear warmup before cosine decay")
    parser.add_argument("--seed", type=int, default=0, help="split, init, sampling, augmentation")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads; use 1 if other jobs share the cores (2 contended threads ran ~6x slower)")
    parser.add_argument("--device", default="cpu",
                        help="torch device to train on, e.g. cpu or cuda (frames are held there too; the "
                             "checkpoint is the same files either way)")
    parser.add_argument("--val-fraction", type=float, default=0.05, help="episodes held out")
    parser.add_argument("--eval-every", type=int, default=500, help="steps between validation log lines")
    parser.add_argument("--save-every", type=int, default=1000, help="steps between checkpoints")
    parser.add_argument("--keyframe-weight", type=float, default=1.0,
                        help="vla: loss weight of the frames just after each change of the gripper command, "
                             "where the fingers have not followed it yet (1: every frame alike; kept on --resume). The "
                             "logged train_loss is weighted with it, val_loss never")
    parser.add_argument("--keyframe-window", type=int, default=8,
                        help="vla: how many frames from each gripper command change get --keyframe-weight")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/train_state.pt")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the training run in --out (its files are removed when the new run starts)")
    parser.add_argument("--init-from", type=Path, default=None,
                        help="fine-tune this checkpoint (weights, tokenizers, action bins; with --arch openvla an "
                             "OpenVLA checkpoint) instead of a new model; the model size flags are then ignored")
    parser.add_argument("--action-bounds", choices=ACTION_BOUNDS, default=None,
                        help="vla: where the 256 action bins end per dimension. quantile: the demonstrations' 1st and "
                             "99th percentiles, as OpenVLA (an action outside is clipped to the end bin); absmax: "
                             "+-the largest |action|, so that a move made in under 1%% of the frames keeps its size "
                             "(LIBERO-10's pitch turns were cut to a tenth: BENCHMARKS 18.28). Default: quantile for a "
                             "new model, the checkpoint's own with --init-from (given, the fine-tune's bins are "
                             "recomputed from --demos and it relearns the tokens); a resumed run keeps its own")
    parser.add_argument("--no-gripper-state", action="store_true",
                        help="vla: the target stops reading the gripper opening from the robot state (with "
                             "--init-from too; it keeps the end effector's xyz), so the frames alone decide when to "
                             "close (targets that read it mostly repeat it; on LIBERO-10 a fine-tune without it "
                             "chattered more: BENCHMARKS 18.11)")
    parser.add_argument("--film", action="store_true",
                        help="vla: condition the CNNs on the instruction (FiLM, as RT-1: a scale and a shift per "
                             "channel of every stage from the prompt's normalized mean embedding), so that one small target's "
                             "few image tokens can differ per task; with --init-from the FiLM layers start at zero "
                             "(the fine-tune starts from the checkpoint's exact behaviour). Such a target's vision "
                             "is not replayed as CUDA graphs")
    parser.add_argument("--skip-invalid-episodes", action="store_true",
                        help="leave out demonstrations with non-finite or empty data (counted) instead of refusing")
    parser.add_argument("--workers", type=int, default=None,
                        help="--arch openvla: processes preparing frames (JPEG + Lanczos, ~15 ms each); default --threads")
    size = parser.add_argument_group("model size (ignored with --resume and --init-from)")
    size.add_argument("--hidden-size", type=int, default=None,
                      help="LLM width (MLP 4x, 4 heads); default 192 (vla) or the openvla shape's 128")
    size.add_argument("--layers", type=int, default=None, help="LLM decoder layers; default 4")
    size.add_argument("--image-size", type=int, default=64, help="vla: frames are resized to this square "
                      "(openvla: always the protocol's 224)")
    size.add_argument("--vision-channels", default="32,64,128,128", help="vla: one stride-2 stage per entry")
    size.add_argument("--wrist", action="store_true",
                      help="vla, LIBERO: read the wrist camera beside agentview (a CNN per camera, twice the image "
                           "tokens); the demonstrations must hold its frames (`heisd demos --wrist`), and the target's "
                           "evaluation and server then render or take them too")
    size.add_argument("--shift-pad", type=int, default=None,
                      help="vla: random-shift augmentation in pixels at --image-size (DrQ; default 1); it also "
                           "shifts where objects appear, so it blurs absolute positions by as much")
    size.add_argument("--crop-area", type=float, default=0.9,
                      help="openvla: OpenVLA's augmentation, random square crops of this area of the frame resized "
                           "back (1 = off); its LIBERO eval center-crops the same area unless --no-center-crop")
    size.add_argument("--patch-size", type=int, default=None,
                      help="openvla: ViT patch size in pixels of the 224 px frame (default: the small shape's 28, "
                           "64 image tokens; OpenVLA-7B's 14 gives 256). Also with --init-from: the checkpoint's "
                           "patch and position embeddings are resampled to it (FlexiViT), every other weight kept")
    size.add_argument("--noop-threshold", type=float, default=0.1,
                      help="openvla: leave out steps that move less than this in every dimension with the gripper "
                           "unchanged and the fingers at rest, as OpenVLA's LIBERO data leaves out no-op steps (0 "
                           "keeps all): a target that reads no state cannot see how long the experts' grasp wait "
                           "has lasted, but it must see the fingers closing labelled 'close'")
    size.add_argument("--aux-state-weight", type=float, default=0.0,
                      help="openvla: > 0 also trains the image tokens to predict the recorded end-effector and finger "
                           "positions (a linear head, squared error of the standardized values, this weight beside the "
                           "action loss; training only: the saved target still reads images alone, as OpenVLA does)")


def run(args: argparse.Namespace) -> int:
    import math

    import torch

    from heisd.commands.common import torch_device
    from heisd.errors import UsageError
    from heisd.targets.vla.train import TrainConfig, train

    if args.resume and args.overwrite:
        raise UsageError("--resume continues the run in --out, --overwrite replaces it: pass one of them")
    if args.shift_pad is not None and args.shift_pad < 0:
        raise UsageError(f"--shift-pad must be >= 0 pixels, got {args.shift_pad}")
    if args.wrist and args.benchmark != "libero":
        raise UsageError(f"--wrist reads LIBERO's wrist camera; --benchmark {args.benchmark} has none")
    if not (args.keyframe_weight > 0 and math.isfinite(args.keyframe_weight)):
        raise UsageError(f"--keyframe-weight must be a positive number, got {args.keyframe_weight}")
    if args.keyframe_window < 1:
        raise UsageError(f"--keyframe-window must be >= 1 frame, got {args.keyframe_window}")
    if args.chunk is not None and args.chunk < 1:
        raise UsageError(f"--chunk must be >= 1 action, got {args.chunk}")
    if args.arch == "openvla" and args.chunk not in (None, 1):
        raise UsageError("--chunk is for --arch vla (OpenVLA predicts one action per inference)")
    if args.arch == "openvla" and args.action_bounds is not None:
        raise UsageError("--action-bounds is for --arch vla (an OpenVLA checkpoint's bins are its q01/q99)")
    if args.arch == "openvla" and args.keyframe_weight != 1.0:
        raise UsageError("--keyframe-weight is for --arch vla (OpenVLA's fine-tuning weighs every frame alike)")
    torch.set_num_threads(args.threads)
    device = torch_device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # fp32 weights, TF32 math
    cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup_steps=args.warmup_steps,
                      seed=args.seed, val_fraction=args.val_fraction, eval_every=args.eval_every,
                      save_every=args.save_every, keyframe_weight=args.keyframe_weight,
                      keyframe_window=args.keyframe_window)
    if args.arch == "openvla":
        metrics = _train_openvla(args, cfg, str(device))
        print(f"checkpoint: {args.out}  " + " ".join(f"{k}={v}" for k, v in metrics.items()))
        return 0
    hidden = 192 if args.hidden_size is None else args.hidden_size
    overrides = {"hidden_size": hidden, "n_layers": 4 if args.layers is None else args.layers,
                 "intermediate_size": 4 * hidden, "image_size": args.image_size,
                 "vision_channels": tuple(int(c) for c in args.vision_channels.split(",")),
                 "shift_pad": 1 if args.shift_pad is None else args.shift_pad, "views": 2 if args.wrist else 1}
    chunk = args.chunk if args.chunk is not None or args.resume else CHUNK[args.benchmark]
    metrics = train(list(args.demos), args.out, cfg, chunk=chunk, model_overrides=overrides,
                    resume=args.resume, benchmark=args.benchmark, instructions=_registry_instructions(args.benchmark),
                    overwrite=args.overwrite, skip_invalid=args.skip_invalid_episodes,
                    init_from=args.init_from, device=str(device), mask_gripper=args.no_gripper_state,
                    film=args.film, action_bounds=args.action_bounds)
    print(f"checkpoint: {args.out}  " + " ".join(f"{k}={v}" for k, v in metrics.items()))
    return 0


def _train_openvla(args: argparse.Namespace, cfg, device: str) -> dict:
    from heisd.errors import UsageError
    from heisd.targets.openvla.train import OpenVLAShape, train_openvla

    if args.benchmark != "libero":
        raise UsageError("--arch openvla trains on LIBERO demonstrations: pass --benchmark libero")
    if args.wrist:
        raise UsageError("--wrist is heisd's small VLA's: an OpenVLA-architecture target reads agentview alone, as "
                         "OpenVLA does")
    if args.no_gripper_state:
        raise UsageError("--no-gripper-state is heisd's small VLA's: an OpenVLA-architecture target reads no robot "
                         "state at all")
    if args.film:
        raise UsageError("--film is heisd's small VLA's: an OpenVLA-architecture target's vision is OpenVLA's")
    if args.shift_pad is not None:
        raise UsageError("--shift-pad is heisd's small VLA's augmentation; --arch openvla trains with OpenVLA's random "
                         "crops (--crop-area)")
    shape = OpenVLAShape(hidden_size=args.hidden_size, layers=args.layers, crop_area=args.crop_area,
                         noop_threshold=args.noop_threshold, patch_size=args.patch_size,
                         aux_state_weight=args.aux_state_weight)
    return train_openvla(list(args.demos), args.out, cfg, shape, resume=args.resume, overwrite=args.overwrite,
                         skip_invalid=args.skip_invalid_episodes, device=device,
                         workers=args.threads if args.workers is None else args.workers, init_from=args.init_from)


def _registry_instructions(benchmark: str) -> list[str]:
    """Every instruction the benchmark can give, so the tokenizer has whole words for all of them."""
    if benchmark == "mw":
        from heisd.benchmarks.mw import TASKS

        return [t.instruction for t in TASKS.values()]
    return []
