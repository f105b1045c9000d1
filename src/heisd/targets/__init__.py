"""Target VLAs behind one interface (`Target`): the small CNN VLA and OpenVLA checkpoints."""

from heisd.targets.base import ActionCodec, Target, TargetSpec, TeacherForced
from heisd.targets.load import checkpoint_kind, load_target

__all__ = ["ActionCodec", "Target", "TargetSpec", "TeacherForced", "checkpoint_kind", "load_target"]
