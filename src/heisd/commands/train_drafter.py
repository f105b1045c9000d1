"""`heisd train-drafter`: train the SpecVLA baseline's EAGLE-style drafter against a target VLA."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "Train the EAGLE-style drafter on the target VLA's own greedy outputs over demonstration frames."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from heisd.commands.common import add_target_arguments

    add_target_arguments(parser)
    parser.add_argument("--demos", type=Path, nargs="+", required=True, help="HDF5 demonstration files")
    parser.add_argument("--out", type=Path, required=True,
                        help="drafter directory (also caches the generated target features)")
    parser.add_argument("--steps", type=int, default=3000, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, default=128, help="frames per step")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak AdamW learning rate")
    parser.add_argument("--seed", type=int, default=0, help="split, frame subset, init, batches")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--max-frames", type=int, default=None,
                        help="random subset of training frames (bounds the target rollout time); all if unset")
    parser.add_argument("--feature-weight", type=float, default=1.0, help="weight of the smooth-L1 feature loss")
    parser.add_argument("--token-weight", type=float, default=0.1, help="weight of the greedy-token cross-entropy")
    parser.add_argument("--eval-every", type=int, default=500, help="steps between held-out evaluations")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a drafter already in --out (its cached target features are reused)")
    parser.add_argument("--skip-invalid-episodes", action="store_true",
                        help="leave out demonstrations with non-finite or empty data (counted) instead of refusing")


def run(args: argparse.Namespace) -> int:
    from heisd.commands.common import check_demos_camera, load_target
    from heisd.drafter.train import DrafterTrainConfig, train_drafter

    check_demos_camera(args.target, args.demos)
    cfg = DrafterTrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                             max_frames=args.max_frames, feature_weight=args.feature_weight,
                             token_weight=args.token_weight, eval_every=args.eval_every)
    info = train_drafter(load_target(args), args.target, args.demos, args.out, cfg, overwrite=args.overwrite,
                         skip_invalid=args.skip_invalid_episodes)
    final = info["final"]
    print(f"drafter: {args.out}  frames={info['train_frames']}  held-out top-1={final['val_top1']:.3f}  "
          f"wall={info['wall_time_s']}s")
    return 0
