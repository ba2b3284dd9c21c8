"""MindFormers `moe_config` (mixture of experts in a LlamaConfig model, e.g. research/mixtral) → our `model.moe`
(one row per key). Key names and meanings are MindFormers' MoEConfig (mindformers/modules/transformer/moe.py,
read at commit 06d7698) and research/mixtral/mixtral_8x7b/pretrain_mixtral-8x7b.yaml; its Llama experts are
LlamaFeedForward MLPs of width intermediate_size, which is model.ffn_hidden_size here."""
from ms_llm.interop.mindformers.table import num

MOE = "moe_config."
PC = "parallel_config."


def moe(t):
    experts = num(t.get(MOE + "expert_num", 1), MOE + "expert_num", int)
    if experts <= 1:
        t.ignore_prefix(MOE, "expert_num 1 (or absent): every layer has its dense MLP")
        return
    t.mapped(MOE + "expert_num", ("model.moe.num_experts", experts), "routed experts per layer (every layer)")
    top_k = num(t.get(MOE + "num_experts_chosen", 1), MOE + "num_experts_chosen", int)
    if t.has(MOE + "num_experts_chosen"):
        t.mapped(MOE + "num_experts_chosen", ("model.moe.top_k", top_k))
    else:
        t.default(MOE + "num_experts_chosen", ("model.moe.top_k", 1), "MindFormers' MoEConfig default 1")
    cf = num(t.get(MOE + "capacity_factor", 1.1), MOE + "capacity_factor")
    if cf > 0:
        t.mapped(MOE + "capacity_factor", ("model.moe.capacity_factor", cf),
                 "slots per expert = ceil(c · tokens · k / E); the overflow is dropped")
    else:
        t.mapped(MOE + "capacity_factor", ("model.moe.capacity_factor", None), "<= 0 is MindFormers' dropless")
    if not t.has(MOE + "capacity_factor"):
        t.default(MOE + "capacity_factor", ("model.moe.capacity_factor", 1.1), "MindFormers' MoEConfig default")
    aux = num(t.get(MOE + "aux_loss_factor", 0.05), MOE + "aux_loss_factor")
    t.mapped(MOE + "aux_loss_factor", ("model.moe.aux_loss_coef", aux),
             "the Switch load-balancing loss E·Σf·P, 1.0 when balanced, as ms_llm's; TopkRouterV2 adds its balance "
             "loss from aux_loss_types / aux_loss_factors ('expert') instead: check which your version reads")
    if not t.has(MOE + "aux_loss_factor"):
        t.default(MOE + "aux_loss_factor", ("model.moe.aux_loss_coef", 0.05), "MindFormers' MoEConfig default")
    z = num(t.get(MOE + "z_loss_factor", 0.0), MOE + "z_loss_factor")
    t.mapped(MOE + "z_loss_factor", ("model.moe.z_loss_coef", z), "router z-loss coefficient")
    norm = bool(t.get(MOE + "norm_topk_prob", True))
    t.mapped(MOE + "norm_topk_prob", ("model.moe.normalize_top_k", norm))
    if t.get(MOE + "router_dense_type", "float32") != "float32":
        t.ignored(MOE + "router_dense_type", "ms_llm's router always runs in float32")
    t.ignored(MOE + "router_dense_type", "float32, as ms_llm's router always is")
    t.ignored(MOE + "routing_policy", "implementation of the top-k router (TopkRouterV1/V2): ms_llm has one, with "
                                      "the same choice-major capacity order")
    for k in ("use_fused_ops_topkrouter", "use_allgather_dispatcher", "group_wise_a2a", "comp_comm_parallel",
              "comp_comm_parallel_degree", "expert_group_size", "max_router_load", "moe_shared_expert_overlap",
              "save_token_distribution", "cur_layer", "moe_module_name"):
        t.ignored(MOE + k, "kernel or communication choice of MindFormers' MoE: no effect on what is computed")
    if t.get(MOE + "enable_sdrop"):
        t.unsupported(MOE + "enable_sdrop", "drops overflowing tokens by routing score; ms_llm's capacity mode "
                                            "drops by position (first choices first, then token order), as "
                                            "MindFormers' default kdrop does. Only matters when tokens are dropped")
    t.ignored(MOE + "enable_sdrop", "off: tokens dropped by position")
    refused = {"balance_via_topk_bias": "aux-loss-free balancing by a per-expert bias (DeepSeek-V3)",
               "use_gating_sigmoid": "a sigmoid router instead of softmax",
               "enable_cold_hot_expert": "hot/cold expert placement",
               "use_shared_expert_gating": "a gate on the shared expert"}
    for k, what in refused.items():
        if t.get(MOE + k):
            t.unsupported(MOE + k, f"{what} is not implemented in ms_llm")
        t.ignored(MOE + k, "off")
    for k in ("topk_bias_update_rate", "update_step", "hot_expert_num", "cold_token_percent"):
        t.ignored(MOE + k, "used only by a switch that is off")
    if num(t.get(MOE + "routed_scaling_factor", 1.0), MOE + "routed_scaling_factor") != 1.0:
        t.unsupported(MOE + "routed_scaling_factor", "scaling the routed experts' output is not implemented")
    t.ignored(MOE + "routed_scaling_factor", "1.0: unscaled")
    if t.get(MOE + "topk_method", "greedy") != "greedy":
        t.unsupported(MOE + "topk_method", "group-limited top-k (DeepSeek) is not implemented: plain top-k")
    t.ignored(MOE + "topk_method", "greedy: plain top-k")
    for k in ("n_group", "topk_group"):
        t.ignored(MOE + k, "used only by group-limited top-k")
    if t.get(MOE + "aux_loss_types"):
        t.unsupported(MOE + "aux_loss_types", "device- and communication-balance losses are not implemented; the "
                                              "'expert' loss is model.moe.aux_loss_coef")
    t.ignored(MOE + "aux_loss_types", "none")
    t.ignored(MOE + "aux_loss_factors", "none")
    if num(t.get(MOE + "shared_expert_num", 0), MOE + "shared_expert_num", int) > 0:
        t.unsupported(MOE + "shared_expert_num", "MindFormers' Llama with shared experts is a different feed-forward "
                                                 "(LlamaFeedForwardWithMoE); set model.moe.shared_expert_size by hand")
    t.ignored(MOE + "shared_expert_num", "0: no shared expert")
    t.ignored(MOE + "moe_intermediate_size", "read by MindFormers' DeepSeek models; its Llama experts are "
                                             "intermediate_size wide (model.ffn_hidden_size)")
    t.ignored(MOE + "first_k_dense_replace", "read by MindFormers' DeepSeek models; its Llama has experts in every "
                                             "layer")
    t.ignored(MOE + "expert_model_parallel", "see parallel_config.expert_parallel")
    if t.get("use_parallel", False):
        ep = num(t.get(PC + "expert_parallel", 1), PC + "expert_parallel", int)
        t.mapped(PC + "expert_parallel", (PC + "expert_parallel", ep),
                 "experts split over ep of the data-parallel ranks (AllToAll; Ascend only)")
        t.ignored("parallel.enable_alltoall", "ms_llm enables AllToAll when expert_parallel > 1")
