"""Stub out torchvision (PyPI only has CUDA builds) so sglang.srt.configs imports on CPU.
Only multimodal helpers touch it; the KV allocator / radix cache never do.
transformers is imported first so that its availability probe sees no torchvision."""

import importlib.machinery
import sys
from unittest.mock import MagicMock

import transformers  # noqa: F401  (probe torchvision availability before stubbing)

for name in [
    "torchvision",
    "torchvision.transforms",
    "torchvision.transforms.functional",
    "torchvision.io",
    "torchvision.transforms.v2",
    "torchvision.transforms.v2.functional",
    "torchvision.ops",
    "torchvision.models",
]:
    if name not in sys.modules:
        m = MagicMock(name=name)
        m.__spec__ = importlib.machinery.ModuleSpec(name, None)
        m.__path__ = []
        sys.modules[name] = m
