"""One typed dataclass per YAML section. The field list here *is* the config reference.

`choices` in a field's metadata restricts a string field; `help` is the field's line in the README's config
reference (`python -m ms_llm.config.reference`). Defaults are the values a new user should get. Sections are
frozen: a loaded config is data, and values derived later are resolved into new Config objects.
"""
from dataclasses import dataclass, field
from typing import List, Optional, Union


def opt(default, help="", choices=None):
    """A dataclass field with documentation (and optional allowed values) attached."""
    meta = {"help": help}
    if choices:
        meta["choices"] = tuple(choices)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ModelConfig:
    arch: str = opt("gpt2", "model family", choices=("gpt2", "llama"))
    preset: Optional[str] = opt(None, "named shape (gpt2-124m, llama2-7b, tiny-gpt2, tiny-llama); "
                                      "keys set next to it override the preset")
    num_layers: int = opt(4, "decoder layers")
    hidden_size: int = opt(128, "model width")
    num_heads: int = opt(4, "attention heads")
    num_kv_heads: Optional[int] = opt(None, "key/value heads for grouped-query attention (null: = num_heads)")
    ffn_hidden_size: Optional[int] = opt(None, "MLP inner width (null: 4*hidden for gpt2, "
                                               "the Llama 2/3*4*hidden rounded to multiple_of for llama)")
    multiple_of: int = opt(256, "llama: round the derived ffn_hidden_size up to a multiple of this")
    seq_length: int = opt(64, "tokens per sample seen by the model (the data holds seq_length+1)")
    vocab_size: Optional[int] = opt(None, "null: taken from the dataset manifest")
    init_std: float = opt(0.02, "std of the normal init; residual projections get init_std/sqrt(2*num_layers)")
    dropout: float = opt(0.0, "dropout on attention probs, residual branches and embeddings")
    bias: bool = opt(False, "biases in linear layers and LayerNorm (gpt2 only)")
    tie_embeddings: bool = opt(True, "share the token embedding with the LM head")
    norm_eps: float = opt(1e-5, "epsilon of LayerNorm / RMSNorm")
    rope_theta: float = opt(10000.0, "llama: RoPE base")


@dataclass(frozen=True)
class DataConfig:
    dataset_dir: str = opt("data/shakespeare_char", "folder with train/val MindRecord + manifest.json")
    source: Optional[str] = opt(None, "text or JSONL file; when dataset_dir has no manifest, training "
                                      "preprocesses this first")
    tokenizer: str = opt("char", "char, byte, or the path of a Hugging Face tokenizer.json")
    val_fraction: float = opt(0.1, "share of the corpus (by tokens, taken from its end) kept for validation")
    text_field: str = opt("text", "JSONL key holding the document text")
    num_workers: int = opt(1, "dataset reader threads")
    blend: Optional[List[List[Union[float, str]]]] = opt(
        None, "mix preprocessed datasets by weight, e.g. [[0.7, data/web], [0.3, data/code]] (null: dataset_dir "
              "alone); the mixture follows train.seed and resumes exactly")


@dataclass(frozen=True)
class AnomalyConfig:
    zscore: float = opt(6.0, "skip an update whose grad norm or loss is this many std devs above the running mean")
    window: int = opt(50, "steps of history for the running mean / std (no skipping before that)")
    max_nonfinite: int = opt(3, "after this many consecutive non-finite steps, roll back to the last checkpoint")
    lr_factor: float = opt(0.5, "multiply the learning rate by this at each rollback")


@dataclass(frozen=True)
class TrainConfig:
    global_batch_size: int = opt(12, "samples per optimizer step over all ranks and micro-batches")
    micro_batch_size: int = opt(12, "samples per forward/backward on one rank; "
                                    "accumulation steps = global / (micro * data_parallel)")
    max_steps: int = opt(2000, "optimizer steps")
    stop_at_step: Optional[int] = opt(None, "end this process after this step with a checkpoint, as a preemption "
                                            "would (time-boxed jobs; resume later with --resume)")
    lr: float = opt(1e-3, "peak learning rate")
    min_lr: float = opt(1e-4, "final learning rate of the decay")
    warmup_steps: int = opt(100, "linear warmup from 0 to lr")
    lr_schedule: str = opt("cosine", "decay after warmup", choices=("cosine", "linear", "constant"))
    decay_steps: Optional[int] = opt(None, "step at which the decay reaches min_lr (null: max_steps)")
    weight_decay: float = opt(0.1, "AdamW decoupled weight decay, applied to matrices only")
    beta1: float = opt(0.9, "AdamW beta1")
    beta2: float = opt(0.99, "AdamW beta2")
    eps: float = opt(1e-8, "AdamW epsilon")
    clip_grad: float = opt(1.0, "clip the global gradient norm to this after accumulation (0: off)")
    seed: int = opt(1337, "seeds init, data order and dropout")
    log_interval: int = opt(10, "steps between log lines")
    eval_interval: int = opt(250, "steps between validation passes (0: only at the end)")
    eval_steps: int = opt(200, "validation batches of global_batch_size samples per pass (capped at the split size)")
    loss_chunk_tokens: int = opt(1024, "LM head + cross-entropy over this many tokens at a time (forward and "
                                       "backward), so only one chunk's float32 logits exist; equal to the whole "
                                       "loss within float32 rounding (0: the whole (tokens, vocab) logits at once)")
    anomaly: Optional[AnomalyConfig] = opt(None, "anomaly guard: skip spiking updates, roll back after repeated "
                                                 "non-finite steps (null: off; true: defaults)")


@dataclass(frozen=True)
class PrecisionConfig:
    compute_dtype: str = opt("float32", "dtype of matmuls and activations; softmax, norms, loss and "
                                        "master weights stay float32", choices=("float32", "float16", "bfloat16"))
    loss_scale: str = opt("dynamic", "loss scaling", choices=("dynamic", "static", "none"))
    init_scale: float = opt(65536.0, "initial (dynamic) or fixed (static) loss scale")
    scale_window: int = opt(1000, "dynamic: double the scale after this many overflow-free steps")
    scale_factor: float = opt(2.0, "dynamic: growth / back-off factor")


@dataclass(frozen=True)
class ParallelConfig:
    data_parallel: Optional[int] = opt(None, "data-parallel ranks (null: world size / (model_parallel * pipeline_stage))")
    model_parallel: int = opt(1, "tensor-parallel ranks")
    pipeline_stage: int = opt(1, "pipeline stages")
    micro_batch_num: int = opt(1, "pipeline micro-batches per step (= global / (data_parallel × micro batch) "
                                  "when pipeline_stage > 1)")
    stage_layers: Optional[List[int]] = opt(None, "layers per pipeline stage, e.g. [9, 10, 10, 9] "
                                                  "(null: balanced)")
    use_seq_parallel: bool = opt(False, "shard norms / residuals along the sequence (needs model_parallel > 1)")
    vocab_emb_dp: bool = opt(True, "embedding / LM head data-parallel instead of vocab-split")
    optimizer_shard: bool = opt(False, "shard optimizer states over data-parallel ranks")


@dataclass(frozen=True)
class RecomputeConfig:
    recompute: Union[bool, List[int]] = opt(False, "true: recompute every layer; a list: layers per stage")
    select_recompute: bool = opt(False, "recompute only attention core and MLP activation")


@dataclass(frozen=True)
class CheckpointConfig:
    save_interval: int = opt(0, "steps between checkpoints (0: only the final one)")
    auto_resume: bool = opt(False, "resume from the newest valid checkpoint in the run directory (or, when "
                                   "that is empty, in remote_dir)")
    keep_last: int = opt(3, "checkpoints kept per rank (older ones pruned after a save completes)")
    format: str = opt("ckpt", "tensor file format", choices=("ckpt", "safetensors"))
    async_save: bool = opt(False, "write checkpoints in a background thread (training continues meanwhile)")
    remote_dir: Optional[str] = opt(None, "obs://, s3:// or a directory: every completed checkpoint and the run's "
                                          "metrics are copied there")
    uploader: Optional[str] = opt(None, "'package.module:Class' with put/get/listdir, for other remote stores")
    strategy_dir: Optional[str] = opt(None, "where semi-auto parallel saves its strategy file per rank (null: "
                                            "<run dir>/strategy); kept with the checkpoints for resharding")
    load_weights: Optional[str] = opt(None, "initialise the model from this checkpoint's weights (e.g. one "
                                            "converted from Hugging Face); optimizer starts fresh")


@dataclass(frozen=True)
class ProfileConfig:
    start_step: int = opt(10, "first profiled step (after this many steps have run; past the compile)")
    stop_step: int = opt(20, "profiling stops after this step; the top-10 operator table is printed then")
    output_dir: Optional[str] = opt(None, "where the trace goes (null: <run dir>/profile)")


@dataclass(frozen=True)
class TensorStatsConfig:
    every: int = opt(100, "record statistics every this many steps")
    targets: List[str] = opt([], "substrings of module/parameter names to record (empty: all)")
    vanish_norm: float = opt(1e-8, "a gradient norm below this ...")
    vanish_records: int = opt(3, "... for this many consecutive records is flagged as vanishing")
    explode_zscore: float = opt(6.0, "a gradient norm this many std devs above its recent history is flagged")


@dataclass(frozen=True)
class MonitorConfig:
    summary: bool = opt(True, "write MindSpore Insight summary files under <run>/summary")
    tensorboard: bool = opt(False, "write TensorBoard event files under <run>/tensorboard (needs tensorboardX: "
                                   "pip install -e \".[tensorboard]\")")
    report: bool = opt(True, "refresh <run>/report.html (curves, events, diagnosis) at every evaluation and at the end")
    telemetry_interval_s: Optional[float] = opt(30.0, "sample device temperature, power, memory and utilisation "
                                                      "(npu-smi / nvidia-smi; CPU load and RSS) into telemetry.jsonl "
                                                      "every this many seconds (null: off)")
    progress_bar: bool = opt(True, "tqdm progress bar on rank 0 at a terminal (elsewhere: a progress line every 30 s)")
    peak_tflops: Optional[float] = opt(None, "per-device peak for MFU (null: a default by device)")
    nan_check: bool = opt(False, "check every step's loss and grad norm (one host sync per step); on the first "
                                 "non-finite step, save the batch and state and run the NaN hunter (token ids are "
                                 "checked before every step whether or not this is on)")
    tensor_stats: Optional[TensorStatsConfig] = opt(None, "per-layer activation/gradient statistics to "
                                                          "stats.jsonl, e.g. {every: 100} (null: off)")
    profile: Optional[ProfileConfig] = opt(None, "profile a window of steps with mindspore.profiler, e.g. "
                                                 "{start_step: 10, stop_step: 20} (null: off)")


@dataclass(frozen=True)
class ContextConfig:
    device_target: str = opt("auto", "where to run (auto: Ascend, then GPU, then CPU)",
                             choices=("auto", "CPU", "GPU", "Ascend"))
    mode: str = opt("graph", "graph (compiled) or pynative (eager, for debugging)", choices=("graph", "pynative"))
    device_id: Optional[int] = opt(None, "device index (null: from the launcher / 0)")
    jit_level: Optional[str] = opt(None, "MindSpore jit_level", choices=("O0", "O1", "O2"))
    max_device_memory: Optional[str] = opt(None, "e.g. '58GB' on Ascend")
    num_threads: Optional[int] = opt(None, "CPU kernel threads (null: MindSpore default)")
    compile_cache: bool = opt(True, "reuse compiled graphs of an identical config+code from "
                                    "~/.cache/ms_llm/compile (restarts, resumes and benchmarks skip compilation)")
    cpu_kernels: bool = opt(True, "on CPU, fused C++ kernels for GELU, LayerNorm and the gradient norm "
                                  "(compiled with g++ at first use; plain MindSpore ops if that fails)")


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    recompute_config: RecomputeConfig = field(default_factory=RecomputeConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    context: ContextConfig = field(default_factory=ContextConfig)
