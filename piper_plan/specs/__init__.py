"""What the user describes: models and hardware."""
from .hardware import HardwareSpec
from .model import ModelSpec, MoESpec, MLASpec
from .registry import bundled_names, load_hardware, load_model

__all__ = ["HardwareSpec", "ModelSpec", "MoESpec", "MLASpec", "bundled_names", "load_hardware", "load_model"]
