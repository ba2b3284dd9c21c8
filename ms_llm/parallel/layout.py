"""The parallel plan as plain data: device mesh, a shard strategy per decoder primitive, the pipeline stage
of every layer, micro-batching, optimizer sharding and recompute — built and validated from the config
alone, so it can be inspected and tested on a laptop and applied (ms_llm.parallel.apply) on Ascend.

Strategies use MindSpore's semi-auto convention: one tuple per input, one entry per tensor axis, the
number of slices along that axis. Activations are 2-D (tokens, hidden) in the linear layers and 4-D
(batch, heads, seq, head_dim) in attention; weights are (out, in) and multiplied with transpose_b.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ms_llm.errors import UserError


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

    @property
    def semi_auto(self):
        """Tensor/pipeline parallelism and optimizer sharding run through MindSpore's semi-auto parallel mode;
        plain data parallelism runs with an explicit gradient all-reduce (which also works on CPU)."""
        return self.mp * self.pp > 1 or self.optimizer_shard

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

    def out_strategy_for(self, path):
        return _lookup(self.out_strategies, path)

    def table(self):
        rows = [f"mesh: {self.devices} devices = data {self.dp} x model {self.mp} x pipeline {self.pp}"
                f"{' (+ sequence parallel)' if self.seq_parallel else ''}"
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


def build_plan(cfg, devices, check_batch=True):
    """Validate the parallel layout against the model and the device count; return the plan.

    `check_batch=False` skips the batch arithmetic, for uses that only need the model's slicing (resharding)."""
    m, pc, t, rc = cfg.model, cfg.parallel_config, cfg.train, cfg.recompute_config
    mp, pp = pc.model_parallel, pc.pipeline_stage
    dp = pc.data_parallel if pc.data_parallel is not None else devices // (mp * pp) if devices % (mp * pp) == 0 else 0
    if dp * mp * pp != devices or dp == 0:
        raise UserError(f"parallel_config: data_parallel × model_parallel × pipeline_stage = "
                        f"{pc.data_parallel or '?'} × {mp} × {pp} must equal the {devices} devices. Choose factors of "
                        f"{devices} (data_parallel: null derives it from the other two).")
    kv = m.num_kv_heads or m.num_heads
    for name, value in (("model.num_heads", m.num_heads), ("model.num_kv_heads", kv),
                        ("model.hidden_size", m.hidden_size), ("model.ffn_hidden_size", m.ffn_hidden_size)):
        if value % mp:
            raise UserError(f"{name} = {value} is not divisible by parallel_config.model_parallel = {mp}: tensor "
                            f"parallelism splits it evenly over {mp} devices. Use a model_parallel that divides {value}.")
    if not pc.vocab_emb_dp and m.vocab_size and m.vocab_size % mp:
        raise UserError(f"model.vocab_size = {m.vocab_size} is not divisible by parallel_config.model_parallel = {mp} "
                        f"while vocab_emb_dp is false (the embedding is split by vocabulary). Pad the vocabulary to a "
                        f"multiple of {mp} or set parallel_config.vocab_emb_dp: true.")
    if m.num_layers < pp:
        raise UserError(f"model.num_layers = {m.num_layers} is smaller than parallel_config.pipeline_stage = {pp}: "
                        f"every stage needs at least one layer.")
    if pc.use_seq_parallel and mp == 1:
        raise UserError("parallel_config.use_seq_parallel = true needs parallel_config.model_parallel > 1: sequence "
                        "parallelism splits the work that tensor parallelism replicates. Set it to false.")
    per_step = t.micro_batch_size * dp
    if check_batch and t.global_batch_size % per_step:
        raise UserError(f"train.global_batch_size = {t.global_batch_size} is not divisible by "
                        f"train.micro_batch_size × data_parallel = {t.micro_batch_size} × {dp} = {per_step}. Choose a "
                        f"global batch that is a multiple of {per_step}, or change the micro batch; accumulation "
                        f"steps are derived as global / (micro × data_parallel).")
    accum = max(1, t.global_batch_size // per_step)
    micro = accum  # micro-batches per step on each data-parallel rank (the pipeline's, when pp > 1)
    warnings = []
    if pp > 1 and check_batch:
        if pc.micro_batch_num != accum:
            raise UserError(f"parallel_config.micro_batch_num = {pc.micro_batch_num}, but with pipeline_stage > 1 the "
                            f"micro-batches of a step are global_batch_size / (data_parallel × micro_batch_size) = "
                            f"{accum}. Set micro_batch_num: {accum}, or change the batch sizes.")
        if micro < pp:
            raise UserError(f"parallel_config.micro_batch_num = {micro} is smaller than pipeline_stage = {pp}: some "
                            f"stages would idle every step. Use at least {pp} micro-batches (4 × {pp} = {4 * pp} keeps "
                            f"the bubble under 20%).")
        if micro < 4 * pp:
            warnings.append(f"micro_batch_num = {micro} < 4 × pipeline_stage: pipeline bubble "
                            f"{100 * (pp - 1) / (micro + pp - 1):.0f}% of step time")
    override = getattr(pc, "stage_layers", None)
    if override and (len(override) != pp or sum(override) != m.num_layers or min(override) < 1):
        raise UserError(f"parallel_config.stage_layers = {override} must list {pp} positive layer counts summing to "
                        f"model.num_layers = {m.num_layers}.")
    if isinstance(rc.recompute, list) and (len(rc.recompute) != pp or any(n < 0 for n in rc.recompute)):
        raise UserError(f"recompute_config.recompute = {rc.recompute}: a list gives the number of recomputed layers "
                        f"per pipeline stage, so it needs {pp} non-negative entries (or use true/false).")
    strategies, outs = decoder_strategies(m.arch, dp, mp, pc.use_seq_parallel, pc.vocab_emb_dp)
    stages = balanced_stages(m.num_layers, pp, override)
    return ParallelPlan(devices, dp, mp, pp, micro, accum, pc.use_seq_parallel, pc.optimizer_shard,
                        pc.vocab_emb_dp, strategies, outs, stages, recompute_layers(rc, stages, pp), warnings)
