"""``python -m mmeffvit.ops.policy``: the kernel policy in force, what was detected and why."""
from . import describe

print(describe())
