"""The parallel plan as plain data: device mesh, a shard strategy per decoder primitive, the pipeline stage
of every layer, micro-batching, optimizer sharding and recompute — built and validated from the config
alone, so it can be inspected and tested on a laptop and applied (ms_llm.parallel.apply) on Ascend.

Strategies use MindSpore's semi-auto convention: one tuple per input, one entry per tensor axis, the
number of slices along that axis. Activations are 2-D (tokens, hidden) in the linear layers and 4-D
(batch, heads, seq, head_dim) in attention; weights are (out, in) and multiplied with transpose_b.
"""
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple

from ms_llm.errors import UserError
from ms_llm.parallel.shapes import Layout, ModelShape, balanced_stages

DEFAULT_DEVICES_PER_NODE = 8


@dataclass
class ParallelPlan:
    devices: int
    dp: int
    mp: int
    pp: int
    micro_batch_num: int
    accumulation: int
    seq_parallel: bool
    optimizer_shard: bool
    vocab_emb_dp: bool
    strategies: Dict[str, Tuple] = field(default_factory=dict)  # op path ("layers.{i}." prefix) -> in strategy
    out_strategies: Dict[str, Tuple] = field(default_factory=dict)
    stage_of_layer: List[int] = field(default_factory=list)
    recompute_of_layer: List[Optional[str]] = field(default_factory=list)  # "full" | "select" | None
    warnings: List[str] = field(default_factory=list)
    # entries for fused kernels a backend may not build (Ascend's LayerNorm/RmsNorm): they may match nothing
    optional: Tuple[str, ...] = ("layers.{i}.attn_norm.op", "layers.{i}.mlp_norm.op")
    ep: int = 1  # expert parallelism: ranks (within data parallel) the routed experts are split over

    @property
    def semi_auto(self):
        return self.mp * self.pp * self.ep > 1 or self.optimizer_shard  # the rule of uses_semi_auto

    @property
    def bubble(self):
        """1F1B pipeline bubble: (pp - 1) / (micro-batches + pp - 1)."""
        return (self.pp - 1) / (self.micro_batch_num + self.pp - 1) if self.pp > 1 else 0.0

    def data_rank(self, rank):
        """Which data-parallel slice of the global batch `rank` reads. MindSpore numbers devices stage by
        stage, and within a stage the model-parallel index varies fastest (tensor-parallel peers are
        neighbours), so ranks that differ only in their stage or model-parallel position read the same slice."""
        return (rank % (self.dp * self.mp)) // self.mp

    def layers_of_stage(self, stage):
        return [i for i, s in enumerate(self.stage_of_layer) if s == stage]

    def strategy_for(self, path):
        """Strategy of a concrete op path ("layers.3.attention.qkv.matmul"), matching "layers.{i}." entries."""
        return _lookup(self.strategies, path)

    def key_for(self, path):
        """The plan entry ("layers.{i}.attention.qkv.matmul") a concrete op path matches, or None."""
        parts = path.split(".")
        if path in self.strategies:
            return path
        if len(parts) > 2 and parts[0] == "layers" and parts[1].isdigit():
            key = ".".join(["layers", "{i}", *parts[2:]])
            return key if key in self.strategies else None
        return None

    def out_strategy_for(self, path):
        return _lookup(self.out_strategies, path)

    def table(self):
        rows = [f"mesh: {self.devices} devices = data {self.dp} x model {self.mp} x pipeline {self.pp}"
                f"{' (+ sequence parallel)' if self.seq_parallel else ''}"
                f"{f', experts split over {self.ep} of the data-parallel ranks (all-to-all)' if self.ep > 1 else ''}"
                f"{', optimizer sharded over data' if self.optimizer_shard else ''}",
                f"micro-batches per step: {self.micro_batch_num} (accumulation {self.accumulation})"
                + (f", pipeline bubble {100 * self.bubble:.1f}%" if self.pp > 1 else "")]
        for stage in range(self.pp):
            layers = self.layers_of_stage(stage)
            extra = (["embedding"] if stage == 0 else []) + (["final norm", "LM head"] if stage == self.pp - 1 else [])
            span = f"layers {layers[0]}-{layers[-1]}" if layers else "no layers"
            rows.append(f"stage {stage}: {span} ({len(layers)})" + (f" + {', '.join(extra)}" if extra else ""))
        rows.append("shard strategies (inputs; slices per axis):")
        for path, strat in self.strategies.items():
            out = self.out_strategies.get(path)
            rows.append(f"  {path:<38} {strat}" + (f" -> out {out}" if out else ""))
        rec = {r for r in self.recompute_of_layer if r}
        if rec:
            full = sum(r == "full" for r in self.recompute_of_layer)
            sel = sum(r == "select" for r in self.recompute_of_layer)
            rows.append(f"recompute: {full} layer(s) full, {sel} layer(s) attention core + MLP activation only")
        return "\n".join(rows + [f"warning: {w}" for w in self.warnings])


def uses_semi_auto(pc):
    """Whether the parallel_config section runs through MindSpore's semi-auto parallel mode: tensor/pipeline
    parallelism and optimizer sharding do; plain data parallelism runs with an explicit gradient all-reduce (which
    also works on CPU)."""
    return pc.model_parallel * pc.pipeline_stage * pc.expert_parallel > 1 or pc.optimizer_shard


def _lookup(table, path):
    if path in table:
        return table[path]
    parts = path.split(".")
    if len(parts) > 2 and parts[0] == "layers" and parts[1].isdigit():
        return table.get(".".join(["layers", "{i}", *parts[2:]]))
    return None


def decoder_strategies(arch, dp, mp, seq_parallel, vocab_emb_dp):
    """{op path: strategy} for the primitives of one decoder layer and the embedding/head."""
    tokens = dp * mp if seq_parallel else dp  # with sequence parallel, norms and residuals split tokens over mp
    column = ((dp, 1), (mp, 1))      # y = x W^T, W split by output rows: no communication
    row = ((dp, mp), (1, mp))        # input features split: partial sums all-reduced (or reduce-scattered)
    heads = ((dp, mp, 1, 1), (dp, mp, 1, 1))
    up = "mlp.up.matmul" if arch == "gpt2" else "mlp.gate_up.matmul"
    s = {
        "layers.{i}.attention.qkv.matmul": column,
        "layers.{i}.attention.core.qk": heads,
        "layers.{i}.attention.core.softmax": ((dp, mp, 1, 1),),
        "layers.{i}.attention.core.pv": heads,
        "layers.{i}.attention.out.matmul": row,
        f"layers.{{i}}.{up}": column,
        "layers.{i}.mlp.down.matmul": row,
        "layers.{i}.attn_norm.op": ((tokens, 1), (1,), (1,)) if arch == "gpt2" else ((tokens, 1), (1,)),
        "layers.{i}.mlp_norm.op": ((tokens, 1), (1,), (1,)) if arch == "gpt2" else ((tokens, 1), (1,)),
        "embedding_gather": ((1, 1), (dp, 1)) if vocab_emb_dp else ((mp, 1), (dp, 1)),
        "head.matmul": ((dp, 1), (1, 1)) if vocab_emb_dp else ((dp, 1), (mp, 1)),
    }
    out = {}
    if seq_parallel and mp > 1:  # row-parallel outputs are reduce-scattered along tokens instead of all-reduced
        out = {"layers.{i}.attention.out.matmul": ((dp * mp, 1),), "layers.{i}.mlp.down.matmul": ((dp * mp, 1),)}
    return s, out


def moe_strategies(dp, mp, ep, shared, dense_layers):
    """{op path: strategy} of the mixture-of-experts layers (ms_llm.nn.moe), and the dense MLP entries to drop
    when every layer is an MoE layer. The routed experts' batched matmuls split the expert axis over ep ranks and
    each expert's inner width over mp (column- then row-parallel, as the dense MLP); the router and the shared
    expert's gate stay data-parallel. Between the token-split router side and the expert-split matmuls MindSpore
    redistributes with AllToAll (dispatch before the experts, combine after; `enable_alltoall`, apply.py)."""
    s = {
        "layers.{i}.mlp.router.matmul": ((dp, 1), (1, 1)),
        "layers.{i}.mlp.experts.up_matmul": ((ep, 1, 1), (ep, mp, 1)),
        "layers.{i}.mlp.experts.down_matmul": ((ep, 1, mp), (ep, 1, mp)),
    }
    if shared:
        s.update({"layers.{i}.mlp.shared.gate_up.matmul": ((dp, 1), (mp, 1)),
                  "layers.{i}.mlp.shared.down.matmul": ((dp, mp), (1, mp))})
    drop = () if dense_layers else ("layers.{i}.mlp.gate_up.matmul", "layers.{i}.mlp.down.matmul")
    return s, drop


def recompute_layers(rc, stage_of_layer, pp):
    """Per layer: "full", "select" or None, from recompute_config."""
    out = []
    seen = [0] * pp
    for stage in stage_of_layer:
        if rc.recompute is True:
            full = True
        elif isinstance(rc.recompute, list):
            full = seen[stage] < rc.recompute[stage]
        else:
            full = False
        seen[stage] += 1
        out.append("full" if full else ("select" if rc.select_recompute else None))
    return out


# -- the rules a layout must satisfy: the one copy, used by training, conversion and the planner -------------

def invalid_reasons(shape, layout, devices, check_batch=True):
    """Every reason the layout cannot run, each naming the numbers and the fix ([] when valid).
    `check_batch=False` skips the batch arithmetic, for uses that only need the model's slicing (resharding)."""
    d = layout
    reasons = []
    if d.dp * d.mp * d.pp != devices:
        reasons.append(f"data_parallel × model_parallel × pipeline_stage = {d.dp} × {d.mp} × {d.pp} = "
                       f"{d.dp * d.mp * d.pp}, but there are {devices} devices: make the product equal "
                       f"{devices} (or set parallel_config.data_parallel: null to derive it)")
    for name, value in (("model.num_heads", shape.heads), ("model.num_kv_heads", shape.kv_heads),
                        ("model.ffn_hidden_size", shape.ffn), ("model.hidden_size", shape.hidden)):
        if value % d.mp:
            reasons.append(f"{name} = {value} is not divisible by model_parallel = {d.mp}: tensor parallelism "
                           f"splits it evenly; use a model_parallel that divides {value}")
    if not d.vocab_emb_dp and shape.vocab and shape.vocab % d.mp:
        reasons.append(f"model.vocab_size = {shape.vocab} is not divisible by model_parallel = {d.mp} with "
                       f"vocab_emb_dp = false (embedding and head split by vocabulary): pad the vocabulary to a "
                       f"multiple of {d.mp} or set parallel_config.vocab_emb_dp: true")
    if d.seq_parallel and d.mp == 1:
        reasons.append("use_seq_parallel = true needs model_parallel > 1: sequence parallelism splits what tensor "
                       "parallelism replicates; set it to false")
    if shape.num_layers < d.pp:
        reasons.append(f"model.num_layers = {shape.num_layers} is smaller than pipeline_stage = {d.pp}: every stage "
                       f"needs at least one layer; use pipeline_stage <= {shape.num_layers}")
    if d.pp == 1 and d.micro_batch_num != 1:
        reasons.append(f"micro_batch_num = {d.micro_batch_num} without a pipeline (pipeline_stage = 1): it counts "
                       f"pipeline micro-batches only; without a pipeline, accumulation is derived as global / "
                       f"(data_parallel × micro_batch_size), so remove micro_batch_num or set it to 1")
    if d.pp > 1 and d.micro_batch_num < d.pp:
        reasons.append(f"micro_batch_num = {d.micro_batch_num} is smaller than pipeline_stage = {d.pp}: some stages "
                       f"would idle every step; use at least {d.pp} micro-batches (4 × {d.pp} = {4 * d.pp} keeps "
                       f"the bubble under 20%)")
    per_step = d.dp * d.micro_batch_size
    if check_batch and d.global_batch % per_step:
        reasons.append(f"train.global_batch_size = {d.global_batch} is not divisible by data_parallel × "
                       f"micro_batch_size = {d.dp} × {d.micro_batch_size} = {per_step}: choose a multiple of "
                       f"{per_step}, or change the micro batch (accumulation steps are derived as global / "
                       f"(micro × data_parallel))")
    elif check_batch and d.pp > 1 and d.micro_batch_num != d.micro_batches_per_step:
        reasons.append(f"micro_batch_num = {d.micro_batch_num}, but with pipeline_stage > 1 ms_llm runs all of a "
                       f"step's micro-batches as one pipeline round: global / (dp × micro) = {d.global_batch} / "
                       f"({d.dp} × {d.micro_batch_size}) = {d.micro_batches_per_step}; set micro_batch_num: "
                       f"{d.micro_batches_per_step} or change the batch sizes")
    if d.stage_layers and (len(d.stage_layers) != d.pp or sum(d.stage_layers) != shape.num_layers
                           or min(d.stage_layers) < 1):
        reasons.append(f"parallel_config.stage_layers = {list(d.stage_layers)} must list {d.pp} positive layer "
                       f"counts summing to model.num_layers = {shape.num_layers}")
    if d.ep > 1 and not shape.moe:
        reasons.append(f"expert_parallel = {d.ep} without model.moe: there are no experts to split; set "
                       f"expert_parallel to 1")
    elif d.ep > 1 and shape.experts % d.ep:
        reasons.append(f"model.moe.num_experts = {shape.experts} is not divisible by expert_parallel = {d.ep}: each "
                       f"expert-parallel rank holds whole experts; use an expert_parallel that divides {shape.experts}")
    if d.ep > 1 and d.dp % d.ep:
        reasons.append(f"data_parallel = {d.dp} is not divisible by expert_parallel = {d.ep}: the experts are split "
                       f"over ep of the data-parallel ranks, whose tokens they exchange by all-to-all (MindFormers' "
                       f"rule too); use an expert_parallel that divides {d.dp}")
    if d.full_recompute_layers and len(d.full_recompute_layers) != d.pp:
        reasons.append(f"recompute_config.recompute = {list(d.full_recompute_layers)} lists layers for "
                       f"{len(d.full_recompute_layers)} stages, but pipeline_stage = {d.pp}: give one count "
                       f"per stage")
    return reasons


def flash_attention_default(cfg, target="Ascend"):
    """Whether ms_llm would use Ascend's FlashAttentionScore: the rule of ms_llm/nn/attention.py
    (Ascend, 16-bit compute, head size a multiple of 16, no dropout)."""
    m = cfg.model
    return (target == "Ascend" and cfg.precision.compute_dtype in ("float16", "bfloat16")
            and (m.hidden_size // m.num_heads) % 16 == 0 and m.dropout == 0)


def lora_fields(cfg):
    """Layout fields of finetune.lora (rank 0: full training)."""
    lora = cfg.finetune.lora
    return {"lora_rank": lora.rank, "lora_targets": tuple(lora.targets)} if lora else {}


def layout_from_config(cfg, devices=None, devices_per_node=DEFAULT_DEVICES_PER_NODE, flash_attention=None,
                       target="Ascend"):
    """(Layout, devices) for a loaded Config. devices: --devices, else dp·mp·pp, else one node.
    flash_attention: None = ms_llm's own rule (`flash_attention_default`); target: Ascend or CPU (the device
    kind the memory terms are for)."""
    pc, rc = cfg.parallel_config, cfg.recompute_config
    if devices is not None and devices <= 0:
        raise UserError(f"--devices = {devices} must be a positive number of devices, e.g. --devices 8.")
    model_pipe = pc.model_parallel * pc.pipeline_stage
    if devices is None:
        devices = pc.data_parallel * model_pipe if pc.data_parallel else max(devices_per_node, model_pipe)
    dp = pc.data_parallel or max(1, devices // model_pipe)
    full_layers = ()
    if isinstance(rc.recompute, list):
        full_layers = tuple(rc.recompute)
        if any(n < 0 for n in full_layers):
            raise UserError(f"recompute_config.recompute = {rc.recompute}: layer counts must be >= 0.")
        if not full_layers:  # one count per pipeline stage: an empty list names no stage
            raise UserError(f"recompute_config.recompute = []: a list gives the layers to recompute in each of the "
                            f"parallel_config.pipeline_stage = {pc.pipeline_stage} stage(s). Give "
                            f"{pc.pipeline_stage} count(s), or false to recompute nothing.")
        mode = "selective" if rc.select_recompute else "none"
    else:
        mode = "full" if rc.recompute else "selective" if rc.select_recompute else "none"
    layout = Layout(dp=dp, mp=pc.model_parallel, pp=pc.pipeline_stage, micro_batch_size=cfg.train.micro_batch_size,
                    micro_batch_num=pc.micro_batch_num, global_batch=cfg.train.global_batch_size,
                    seq_parallel=pc.use_seq_parallel, optimizer_shard=pc.optimizer_shard, recompute=mode,
                    full_recompute_layers=full_layers, stage_layers=tuple(pc.stage_layers or ()),
                    vocab_emb_dp=pc.vocab_emb_dp, ep=pc.expert_parallel,
                    compute_dtype=cfg.precision.compute_dtype,
                    flash_attention=flash_attention_default(cfg, target) if flash_attention is None else flash_attention,
                    loss_chunk_tokens=cfg.train.loss_chunk_tokens, target=target, **lora_fields(cfg))
    return layout, devices  # when devices is no multiple of mp·pp, invalid_reasons names the mismatch


def build_plan(cfg, devices, check_batch=True):
    """Validate the parallel layout against the model and the device count; return the plan.

    `check_batch=False` skips the batch arithmetic, for uses that only need the model's slicing (resharding)."""
    m, pc, rc = cfg.model, cfg.parallel_config, cfg.recompute_config
    layout, devices = layout_from_config(cfg, devices)
    # the vocabulary may still be unknown (taken from the dataset later): its rule then waits for the rebuild
    shape = ModelShape.from_config(m if m.vocab_size else replace(m, vocab_size=0))
    reasons = invalid_reasons(shape, layout, devices, check_batch)
    if reasons:
        raise UserError("parallel layout: " + "; ".join(reasons) + ".")
    dp, mp, pp = layout.dp, layout.mp, layout.pp
    accum = max(1, cfg.train.global_batch_size // (layout.micro_batch_size * dp))
    warnings = []
    if pp > 1 and check_batch and accum < 4 * pp:
        warnings.append(f"micro_batch_num = {accum} < 4 × pipeline_stage: pipeline bubble "
                        f"{100 * (pp - 1) / (accum + pp - 1):.0f}% of step time")
    override = pc.stage_layers
    strategies, outs = decoder_strategies(m.arch, dp, mp, pc.use_seq_parallel, pc.vocab_emb_dp)
    if shape.moe:
        routed, drop = moe_strategies(dp, mp, layout.ep, shape.shared_ffn > 0,
                                      len(shape.moe_layer_ids) < shape.num_layers)
        strategies = {**{k: v for k, v in strategies.items() if k not in drop}, **routed}
    stages = balanced_stages(m.num_layers, pp, override)
    return ParallelPlan(devices, dp, mp, pp, accum, accum, pc.use_seq_parallel, pc.optimizer_shard,
                        pc.vocab_emb_dp, strategies, outs, stages, recompute_layers(rc, stages, pp), warnings,
                        ep=layout.ep)


def with_data_parallel(cfg, world_size, device_target):
    """The config with parallel_config.data_parallel derived for a launch of `world_size` ranks (a new object; `cfg`
    is left as it was loaded). Refuses layouts the device cannot run."""
    pc = cfg.parallel_config
    model_pipe = pc.model_parallel * pc.pipeline_stage
    if pc.expert_parallel > 1 and device_target == "CPU":
        raise UserError(f"parallel_config.expert_parallel = {pc.expert_parallel}: expert parallelism sends every "
                        f"token to the rank holding its experts and back with AllToAll, which MindSpore does not run "
                        f"on CPU (nor does it run the semi-auto parallel mode that inserts it). On CPU every rank "
                        f"holds all experts: set expert_parallel to 1 here (data parallelism still runs), or launch "
                        f"on Ascend; `ms-llm plan` estimates the expert-parallel layout without a device.")
    if (model_pipe > 1 or pc.optimizer_shard) and device_target == "CPU":
        raise UserError(f"parallel_config.model_parallel = {pc.model_parallel}, pipeline_stage = {pc.pipeline_stage}, "
                        f"optimizer_shard = {str(pc.optimizer_shard).lower()}: tensor and pipeline parallelism and "
                        f"optimizer sharding use MindSpore's semi-auto parallel mode, which needs Ascend or GPU devices; "
                        f"on CPU only data parallelism runs. Set model_parallel and pipeline_stage to 1 and "
                        f"optimizer_shard to false here, or launch on Ascend.")
    if pc.data_parallel is None:
        if world_size % model_pipe:
            raise UserError(f"{world_size} ranks cannot be split into model_parallel × pipeline_stage = {model_pipe}. "
                            f"Launch a multiple of {model_pipe} workers.")
        cfg = replace(cfg, parallel_config=replace(pc, data_parallel=world_size // model_pipe))
    return cfg
