"""Random (seeded) weights for ``dummy:PRESET``: speed runs do not depend on the values."""
from __future__ import annotations

import torch
from torch import nn

#: Small enough that activations stay finite through dozens of layers.
DUMMY_STD = 0.02


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int, std: float = DUMMY_STD) -> None:
    """Fill every parameter on its own device: floats ~ N(0, std), norms = 1, integers in [0, 16)."""
    generators: dict[torch.device, torch.Generator] = {}
    for name, param in model.named_parameters():
        device = param.device
        if device not in generators:
            generators[device] = torch.Generator(device=device).manual_seed(seed)
        gen = generators[device]
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        elif param.dtype.is_floating_point and param.dtype.itemsize >= 2:
            param.normal_(0.0, std, generator=gen)
        elif param.dtype.is_floating_point:  # fp8 has no normal_: draw in fp32 and cast
            param.copy_(torch.empty(param.shape, device=device).normal_(0.0, std, generator=gen))
        else:
            param.random_(0, 16, generator=gen)  # packed / integer quantized tensors
