"""Parameter creation with the GPT-2 init recipe; all master weights are float32."""
import math

import mindspore as ms
from mindspore import Parameter
from mindspore.common.initializer import Normal, One, Zero, initializer


def normal(shape, std, name):
    return Parameter(initializer(Normal(sigma=std), shape, ms.float32), name=name)


def zeros(shape, name):
    return Parameter(initializer(Zero(), shape, ms.float32), name=name)


def ones(shape, name):
    return Parameter(initializer(One(), shape, ms.float32), name=name)


def residual_std(init_std, num_layers):
    """GPT-2: projections that write into the residual stream are scaled by 1/sqrt(2 * layers)."""
    return init_std / math.sqrt(2 * num_layers)
