"""The two descriptions the parallel planner and the layout rules share, as plain data: the model's sizes
(`ModelShape`) and the parallel choices (`Layout`), with the pipeline's assignment of layers to stages.
No MindSpore here; `layout.py` (the rules) and `memory.py` (the estimate) both build on it."""
from dataclasses import dataclass

from ms_llm.errors import UserError

COMPUTE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class ModelShape:
    arch: str
    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    seq: int
    vocab: int
    tied: bool
    bias: bool
    dropout: float = 0.0  # > 0 keeps dropout masks and outputs as activations
    head_size: int = 0  # 0: hidden / heads (model.head_dim null)
    qkv_bias: bool = False  # biases on q, k, v only (Qwen2.5)
    qk_norm: bool = False  # RMSNorm over each head's q and k (Qwen3)
    # mixture of experts (model.moe): the layers whose MLP is E routed SwiGLU experts of width expert_ffn, top_k of
    # them per token, plus an optional shared expert (and its sigmoid gate); () for a dense model
    moe_layer_ids: tuple = ()
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0
    shared_gate: bool = False
    capacity_factor: float = 0.0  # 0: dropless

    @classmethod
    def from_config(cls, m):
        """From a validated `ModelConfig` (num_kv_heads and ffn_hidden_size already filled in)."""
        from ms_llm.config.validate import expert_ffn, moe_layers

        if m.vocab_size is None:  # 0: not known yet, and its checks skipped
            raise UserError("model.vocab_size is null: planning needs the vocabulary size, which training otherwise "
                            "takes from the dataset manifest. Pass it, e.g. --set model.vocab_size=32000, or use a "
                            "preset (--set model.preset=llama2-7b).")
        moe = {}
        if m.moe is not None:
            moe = dict(moe_layer_ids=tuple(moe_layers(m)), experts=m.moe.num_experts, top_k=m.moe.top_k,
                       expert_ffn=expert_ffn(m), shared_ffn=m.moe.shared_expert_size,
                       shared_gate=m.moe.shared_expert_gate, capacity_factor=m.moe.capacity_factor or 0.0)
        return cls(m.arch, m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads or m.num_heads,
                   m.ffn_hidden_size, m.seq_length, m.vocab_size, m.tie_embeddings, m.bias and m.arch == "gpt2",
                   m.dropout, m.head_dim or 0, m.qkv_bias, m.qk_norm, **moe)

    @property
    def moe(self):
        return bool(self.moe_layer_ids)

    @property
    def head_dim(self):
        return self.head_size or self.hidden // self.heads

    @property
    def attention_width(self):
        """heads × head_dim: the width of q and of the attention output (= hidden unless head_dim is set apart)."""
        return self.heads * self.head_dim

    @property
    def swiglu(self):
        return self.arch == "llama"

    # -- parameters, split by how tensor and expert parallelism treat them ---------------------------
    # Each per-layer count takes `moe`: whether that layer's MLP is the mixture of experts (its dense MLP is then
    # replaced by the routed experts, counted apart by layer_expert_params, and the shared expert if any).
    def layer_split_params(self, moe=False):
        """Per layer, the parameters tensor parallelism splits t ways: the attention and MLP matrices (an MoE
        layer's shared expert in place of its MLP) and the biases of the column-parallel ones (QKV, MLP up)."""
        h, d = self.hidden, self.head_dim
        qkv = h * (self.heads + 2 * self.kv_heads) * d
        out = self.heads * d * h
        mlp = 3 * h * self.shared_ffn if moe else (3 if self.swiglu else 2) * h * self.ffn
        bias = (self.heads + 2 * self.kv_heads) * d + self.ffn if self.bias else 0
        if self.qkv_bias:
            bias += (self.heads + 2 * self.kv_heads) * d
        return qkv + out + mlp + bias

    def layer_expert_params(self, moe=False):
        """Per layer, the routed experts' weights (E SwiGLU MLPs): split over expert-parallel ranks (whole experts)
        and, inside an expert, t ways by tensor parallelism."""
        return self.experts * 3 * self.hidden * self.expert_ffn if moe else 0

    def layer_replicated_params(self, moe=False):
        """Per layer, the parameters every tensor-parallel rank keeps whole: the two norms (and the per-head q/k
        norms), the biases of the row-parallel matrices (attention out, MLP down), and an MoE layer's router (and
        shared-expert gate)."""
        h = self.hidden
        norms = 2 * (2 * h if self.bias else h) + (2 * self.head_dim if self.qk_norm else 0)
        router = self.experts * h + (h if self.shared_gate else 0) if moe else 0
        return norms + (2 * h if self.bias else 0) + router

    def params_of_layers(self, layer_ids):
        """(tensor-split, expert, replicated) parameters of the layers `layer_ids`."""
        moe = set(self.moe_layer_ids)
        split = sum(self.layer_split_params(i in moe) for i in layer_ids)
        expert = sum(self.layer_expert_params(i in moe) for i in layer_ids)
        replicated = sum(self.layer_replicated_params(i in moe) for i in layer_ids)
        return split, expert, replicated

    def inactive_expert_params(self):
        """Routed-expert weights a token does not use: (E − k) experts in every MoE layer."""
        return len(self.moe_layer_ids) * (self.experts - self.top_k) * 3 * self.hidden * self.expert_ffn

    def final_norm_params(self):
        return 2 * self.hidden if self.bias else self.hidden

    def embedding_params(self):
        """Token embedding plus GPT-2's learned position table (first pipeline stage)."""
        positions = self.seq * self.hidden if self.arch == "gpt2" else 0
        return self.vocab * self.hidden + positions

    def head_params(self):
        """The LM head's own weights: 0 when tied to the embedding (last stage)."""
        return 0 if self.tied else self.vocab * self.hidden

    def total_params(self):
        return (sum(self.params_of_layers(range(self.num_layers))) + self.final_norm_params()
                + self.embedding_params() + self.head_params())

    def active_params(self):
        """Parameters one token computes with: all of them, less the experts the router did not pick."""
        return self.total_params() - self.inactive_expert_params()

    def matmul_params(self):
        """Parameters that take part in a matmul for one token: 6 FLOPs each per token. Lookup tables (GPT-2's
        position table, an untied input embedding) multiply nothing, the rule monitor/throughput.py already applies;
        of an MoE layer's experts only the top_k chosen ones compute."""
        lookups = self.embedding_params() - (self.vocab * self.hidden if self.tied else 0)
        return self.active_params() - lookups


@dataclass(frozen=True)
class Layout:
    dp: int
    mp: int
    pp: int
    micro_batch_size: int
    micro_batch_num: int
    global_batch: int
    seq_parallel: bool = False
    optimizer_shard: bool = False
    recompute: str = "none"  # none | selective | full
    full_recompute_layers: tuple = ()  # per stage, when recompute_config.recompute is a list
    stage_layers: tuple = ()  # layers per stage (parallel_config.stage_layers); () = balanced as ms_llm does
    vocab_emb_dp: bool = True
    compute_dtype: str = "bfloat16"
    flash_attention: bool = False  # fused attention keeps no s×s scores (Ascend FlashAttentionScore)
    ep: int = 1  # expert parallelism: experts split over ep of the dp ranks (tokens reach them by all-to-all)
    lora_rank: int = 0  # finetune.lora: adapters of this rank train, the base is frozen (parallel/lora_memory.py)
    lora_targets: tuple = ()
    loss_chunk_tokens: int = 0  # train.loss_chunk_tokens: the LM head and loss over this many tokens at a time
    target: str = "Ascend"  # the device kind the memory terms are for: Ascend (HBM) or CPU (host memory, measured)

    @property
    def semi_auto(self):
        """MindSpore's semi-auto parallel mode runs the step (ms_llm.parallel.layout.ParallelPlan.semi_auto)."""
        return self.mp * self.pp > 1 or self.optimizer_shard

    @property
    def loss_chunk(self):
        """Tokens per chunk of the LM head and loss as the session applies it: not under semi-auto parallel."""
        return 0 if self.semi_auto else self.loss_chunk_tokens

    @property
    def devices(self):
        return self.dp * self.mp * self.pp

    @property
    def micro_batches_per_step(self):
        """Micro-batches each data-parallel replica runs per optimizer step."""
        return self.global_batch // (self.dp * self.micro_batch_size)

    @property
    def compute_bytes(self):
        return COMPUTE_BYTES[self.compute_dtype]

    def describe(self):
        rc = self.recompute if not self.full_recompute_layers else f"full for {list(self.full_recompute_layers)} " \
                                                                    f"layers per stage, else {self.recompute}"
        return (f"dp {self.dp} × mp {self.mp} × pp {self.pp}" + (f" (ep {self.ep} within dp)" if self.ep > 1 else "")
                + f", optimizer_shard {on(self.optimizer_shard)}, "
                f"recompute {rc}, seq parallel {on(self.seq_parallel)}, flash attention {on(self.flash_attention)}"
                + (f", LoRA rank {self.lora_rank}" if self.lora_rank else ""))


def on(flag):
    return "on" if flag else "off"


def stage_layer_ids(num_layers, pp, override=None):
    """[[layer indices of stage 0], [of stage 1], ...] under `balanced_stages`."""
    stages = balanced_stages(num_layers, pp, override)
    return [[i for i, s in enumerate(stages) if s == stage] for stage in range(pp)]


def balanced_stages(num_layers, pp, override=None):
    """Stage of each layer: an explicit per-stage layer count, or as even as possible with the remainder
    given to the middle stages (the first holds the embedding, the last the LM head and loss)."""
    if override:
        counts = list(override)
    else:
        counts = [num_layers // pp] * pp
        middle = list(range(1, pp - 1)) or list(range(pp))
        for k in range(num_layers % pp):
            counts[middle[k % len(middle)]] += 1
    return [stage for stage, n in enumerate(counts) for _ in range(n)]
