"""examples/train/demo.py as a module (its helpers run the training job for tests)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

DEMO = Path(__file__).resolve().parents[2] / "examples" / "train" / "demo.py"


def load_demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module
