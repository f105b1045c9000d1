"""The target VLA: OpenVLA's structure and token conventions at a CPU-trainable size."""

from heisd.targets.vla.action_tokenizer import ActionTokenizer
from heisd.targets.vla.checkpoint import CheckpointError
from heisd.targets.vla.model import VLA, NormStats, TeacherForced, VLAConfig
from heisd.targets.vla.text_tokenizer import PROMPT_TEMPLATE, TextTokenizer, format_prompt

__all__ = ["ActionTokenizer", "CheckpointError", "VLA", "NormStats", "TeacherForced", "VLAConfig",
           "PROMPT_TEMPLATE", "TextTokenizer", "format_prompt"]
