"""What a model is built for. Fast paths are chosen from it once, when a Cell is constructed (never inside
`construct`), and it is handed down as an argument, so model code stays the same on every backend and no
module-level switch couples the layers. The default is the portable composition of MindSpore ops."""
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Backend:
    target: Optional[str] = None  # "Ascend" / "GPU" / "CPU"; None: portable ops only
    cpu_kernels: bool = False  # the fused C++ kernels of ms_llm.nn.cpu_kernels (CPU, when they built)
    layer_reuse: bool = True  # compile the decoder layer once; False when an outer Cell is reused instead

    @property
    def ascend(self):
        return self.target == "Ascend"

    def kernel(self, name, *args):
        """The fused CPU kernel `name` (built for `args` where it has any), or None when this backend does not use
        them."""
        if not self.cpu_kernels:
            return None
        from ms_llm.nn import cpu_kernels

        return cpu_kernels.op(name, *args)


PORTABLE = Backend()


def for_device(target, cpu_kernels=True, layer_reuse=True):
    """The backend a run on `target` gets: fused CPU kernels when asked for and buildable."""
    from ms_llm.nn import cpu_kernels as kernels

    return Backend(target, target == "CPU" and cpu_kernels and kernels.library() is not None, layer_reuse)
