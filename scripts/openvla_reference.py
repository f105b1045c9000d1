"""Run the PUBLIC OpenVLA reference implementation on a checkpoint and print golden numbers as JSON.

Not part of heisd: it runs in a separate, throwaway environment with the reference's pinned
versions, and imports the reference's own files from a checkout of openvla/openvla:

    python3 -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install torch==2.14.1 torchvision==0.29.1
    /tmp/refvenv/bin/pip install timm==0.9.16 transformers==4.40.1 "numpy<2" safetensors pillow
    heisd tiny-openvla --out /tmp/tiny-openvla --seed 0
    /tmp/refvenv/bin/python scripts/openvla_reference.py --hf-dir OPENVLA_CHECKOUT/prismatic/extern/hf \\
        --checkpoint /tmp/tiny-openvla > golden.json

The tiny checkpoint's small ViTs are given as `timm_model_kwargs` in its config.json (ours);
the reference has no such field, so they are passed to `timm.create_model` here. The cases
(frames, instructions) are defined the same way in tests/test_openvla_golden.py.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

CASES = [  # (frame seed, height, width, instruction)
    (1, 224, 224, "pick up the black bowl"),
    (2, 256, 256, "Put the bowl on the stove"),
    (3, 180, 320, "open the middle drawer of the cabinet"),
]
UNNORM_KEY = "libero_spatial_no_noops"


def frame(seed: int, height: int, width: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def file_hashes(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


def import_reference(hf_dir: Path):
    spec = importlib.util.spec_from_file_location("hf", hf_dir / "__init__.py",
                                                  submodule_search_locations=[str(hf_dir)])
    package = importlib.util.module_from_spec(spec)
    sys.modules["hf"] = package
    spec.loader.exec_module(package)
    import hf.modeling_prismatic as modeling
    import hf.processing_prismatic as processing

    return modeling, processing


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hf-dir", type=Path, required=True, help="openvla checkout's prismatic/extern/hf folder")
    p.add_argument("--checkpoint", type=Path, required=True, help="OpenVLA checkpoint directory")
    args = p.parse_args()
    torch.manual_seed(0)
    import timm
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    modeling, processing = import_reference(args.hf_dir)
    config_json = json.loads((args.checkpoint / "config.json").read_text())
    explicit = config_json.get("timm_model_kwargs", [{}, {}])
    ids = config_json["timm_model_ids"]
    create = timm.create_model

    def create_with_kwargs(name, **kwargs):
        return create(name, **{**kwargs, **explicit[ids.index(name)]})

    timm.create_model = create_with_kwargs
    config = modeling.OpenVLAConfig(**{k: v for k, v in config_json.items() if k != "model_type"})
    model = modeling.OpenVLAForActionPrediction(config).eval()
    state = {}
    for f in sorted(args.checkpoint.glob("*.safetensors")):
        state.update(load_file(str(f)))
    model.load_state_dict(state, strict=True)  # the key layout, checked by the reference itself
    saved = json.loads((args.checkpoint / "preprocessor_config.json").read_text())
    image_processor = processing.PrismaticImageProcessor(**saved)
    tokenizer = AutoTokenizer.from_pretrained(str(args.checkpoint))
    processor = processing.PrismaticProcessor(image_processor=image_processor, tokenizer=tokenizer)
    cases = []
    with torch.no_grad():
        for seed, h, w, instruction in CASES:
            prompt = f"In: What action should the robot take to {instruction.lower()}?\nOut:"
            inputs = processor(prompt, Image.fromarray(frame(seed, h, w)))
            out = model(**inputs, output_projector_features=True)
            feats = out.projector_features[0]
            n = model.get_action_dim(UNNORM_KEY)
            ids_in = torch.cat([inputs["input_ids"], torch.tensor([[29871]])], dim=1)
            generated = model.generate(ids_in, pixel_values=inputs["pixel_values"], max_new_tokens=n, do_sample=False)
            action = model.predict_action(**inputs, unnorm_key=UNNORM_KEY, do_sample=False)
            cases.append({
                "seed": seed, "height": h, "width": w, "instruction": instruction,
                "input_ids": inputs["input_ids"][0].tolist(),
                "pixel_mean_per_channel": inputs["pixel_values"][0].mean(dim=(1, 2)).tolist(),
                "projector_mean": float(feats.mean()), "projector_patch0": feats[0, :8].tolist(),
                "tokens": generated[0, -n:].tolist(), "action": np.asarray(action, dtype=np.float64).tolist(),
            })
    versions = {"torch": torch.__version__, "timm": timm.__version__,
                "transformers": sys.modules["transformers"].__version__}
    json.dump({"unnorm_key": UNNORM_KEY, "versions": versions, "files": file_hashes(args.checkpoint),
               "cases": cases}, sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
