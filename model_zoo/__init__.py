"""Model families assembled from ms_llm.nn. `build_model(model_config)` is the one entry point."""
import mindspore as ms
import numpy as np

from ms_llm.nn.dropout import KEY_NAME as DROPOUT_KEY

DTYPES = {"float32": ms.float32, "float16": ms.float16, "bfloat16": ms.bfloat16}


def build_model(m, compute_dtype="float32", backend=None):
    """A CausalLM for the (resolved) `ModelConfig` m, its weights float32, matmuls in `compute_dtype`, with the
    fast paths of `backend` (an ms_llm.nn.backend.Backend; default: portable MindSpore ops)."""
    from ms_llm.nn.backend import PORTABLE

    from model_zoo.gpt2.model import build_gpt2
    from model_zoo.llama.model import build_llama

    if m.vocab_size is None:
        raise ValueError("model.vocab_size must be resolved (from the dataset manifest) before building the model")
    if m.arch == "llama":
        return build_llama(m, DTYPES[compute_dtype], backend or PORTABLE)
    return build_gpt2(m, DTYPES[compute_dtype], backend or PORTABLE)  # model.arch's other choice


def weights(model):
    """{name: Parameter} of the model's weights: every parameter but dropout's key (the seed and this rank's place in
    the batch, ms_llm/nn/dropout.py), which no checkpoint holds."""
    return {p.name: p for p in model.get_parameters() if p.name != DROPOUT_KEY}


def count_params(model, exclude_positions=False):
    n = 0
    for name, p in model.parameters_and_names():
        if (exclude_positions and name.endswith("positions")) or name == DROPOUT_KEY:  # the key is no weight
            continue
        n += int(np.prod(p.shape))
    return n
