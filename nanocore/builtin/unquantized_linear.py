"""``unquantized``: plain weights in the model dtype, ``F.linear``. The linear-method oracle."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from nanocore.interfaces import LinearMethod, builtin_options, set_weight_attrs


class UnquantizedLinearMethod(LinearMethod):
    auto_priority = 0

    def __init__(self, options=None):
        super().__init__(builtin_options(self, UnquantizedLinearMethod, "unquantized", options, {}))

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size,
                       output_size, params_dtype, weight_loader):
        weight = torch.nn.Parameter(
            torch.empty(sum(output_partition_sizes), input_size_per_partition, dtype=params_dtype),
            requires_grad=False,
        )
        set_weight_attrs(weight, {"weight_loader": weight_loader, "output_dim": 0, "input_dim": 1})
        layer.register_parameter("weight", weight)

    def apply(self, layer, x, bias=None):
        return F.linear(x, layer.weight, bias)

    @classmethod
    def quantize(cls, weights, calibration=None):
        return dict(weights), {}
