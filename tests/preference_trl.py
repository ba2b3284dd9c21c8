"""TRL's side of the preference parity tests (tests/test_preference.py): the same random Qwen2 model, the same pairs
and settings, trained by TRL's own DPOTrainer (in a subprocess: torch and MindSpore are kept apart), and TRL's
CPOTrainer.cpo_loss for SimPO.

    python tests/preference_trl.py SPEC.json OUT.json      (see `main`)

writes TRL's log_history of each run (one entry per step: loss and its metrics) to OUT.json. Data order is the
file's (a sequential sampler, as ms_llm's data.shuffle: false), the learning rate constant, AdamW (0.9, 0.999),
no weight decay, gradients clipped at 1.0, float32 on the CPU."""
import json
import sys


def trl_dpo(hf_dir, tok_dir, pairs, loss_type, beta, steps, batch, lr, out_dir):
    import torch
    from datasets import Dataset
    from torch.utils.data import SequentialSampler
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    from trl import DPOConfig, DPOTrainer

    torch.manual_seed(0)
    tok = PreTrainedTokenizerFast.from_pretrained(tok_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
    records = [json.loads(line) for line in open(pairs, encoding="utf-8") if line.strip()]
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}],
                               "chosen": [{"role": "assistant", "content": r["chosen"]}],
                               "rejected": [{"role": "assistant", "content": r["rejected"]}]} for r in records])

    class InOrder(DPOTrainer):  # the file's order, as data.shuffle: false
        def _get_train_sampler(self, *args, **kwargs):
            return SequentialSampler(self.train_dataset)

    args = DPOConfig(output_dir=out_dir, per_device_train_batch_size=batch, max_steps=steps, learning_rate=lr,
                     lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_beta1=0.9,
                     adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0, beta=beta, loss_type=[loss_type],
                     logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, seed=0, max_length=None,
                     dataloader_num_workers=0, disable_dropout=True, remove_unused_columns=False)
    trainer = InOrder(model=model, args=args, train_dataset=data, processing_class=tok)
    trainer.train()
    return [e for e in trainer.state.log_history if "loss" in e]


def sequence_logps(hf_dir, rows, dtype="float32"):
    """(sums, token counts) of each pair's chosen and rejected response log-probs under the Hugging Face model in
    `dtype`, from ms_llm's samples [(ids, loss mask, segments)]: each sequence on its own, as TRL's batches hold
    them."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=getattr(torch, dtype))
    sums, counts = [], []
    for ids, mask, seg in rows:
        ids, mask, seg = (np.asarray(x) for x in (ids, mask, seg))
        pair_s, pair_n = [], []
        for s in (1, 2):
            sel = seg == s
            x = torch.tensor(ids[sel][None].astype(np.int64))
            m = torch.tensor(mask[sel][1:]).to(model.dtype)
            with torch.no_grad():
                lp = torch.log_softmax(model(x).logits[0, :-1], -1).gather(-1, x[0, 1:, None])[:, 0]
            pair_s.append(float((lp * m).sum()))
            pair_n.append(float(m.sum()))
        sums.append(pair_s)
        counts.append(pair_n)
    return sums, counts


def trl_simpo(chosen_avg, rejected_avg, beta, gamma):
    """TRL's CPOTrainer.cpo_loss (loss_type simpo, label_smoothing 0, alpha 0) on per-token log-probs."""
    import types

    import torch
    from trl.experimental.cpo.cpo_trainer import CPOTrainer

    me = types.SimpleNamespace(alpha=0.0, loss_type="simpo", simpo_gamma=gamma, beta=beta, label_smoothing=0.0,
                               accelerator=types.SimpleNamespace(device="cpu"))
    losses, cr, rr = CPOTrainer.cpo_loss(me, torch.tensor(chosen_avg, dtype=torch.float64),
                                         torch.tensor(rejected_avg, dtype=torch.float64))
    return {"loss": float(losses.mean()), "rewards/chosen": float(cr.mean()), "rewards/rejected": float(rr.mean()),
            "rewards/accuracies": float((cr > rr).double().mean()), "rewards/margins": float((cr - rr).mean()),
            "logps/chosen": float(torch.tensor(chosen_avg).mean()),
            "logps/rejected": float(torch.tensor(rejected_avg).mean())}


def main(argv):
    """argv: SPEC.json OUT.json. SPEC: {hf, tok, pairs, steps, batch, lr, runs: [{loss_type, beta}], simpo: {rows,
    beta, gamma} or absent}; OUT: {loss_type: TRL's log_history, "simpo": the formula's loss and metrics,
    "float64": the first batch's mean chosen and rejected log-probs (`logps/...`) from a float64 forward}."""
    import torch

    # one thread, as the test process's MindSpore under xdist: two threads of this tiny model spin more than they
    # compute (the two 20-step trainings: ~9 CPU seconds on one thread, 30 and more on two beside another worker)
    torch.set_num_threads(1)
    spec = json.loads(open(argv[0]).read())
    out = {}
    for run in spec["runs"]:
        out[run["loss_type"]] = trl_dpo(spec["hf"], spec["tok"], spec["pairs"], run["loss_type"], run["beta"],
                                        spec["steps"], spec["batch"], spec["lr"], argv[1] + ".trainer")
    if spec.get("simpo"):
        sp = spec["simpo"]
        sums, counts = sequence_logps(spec["hf"], sp["rows"])
        out["simpo"] = trl_simpo([s[0] / n[0] for s, n in zip(sums, counts)],
                                 [s[1] / n[1] for s, n in zip(sums, counts)], sp["beta"], sp["gamma"])
        # the exact answer the float32 log-probs of both sides are measured against (TRL's drift with the machine)
        sums, _ = sequence_logps(spec["hf"], sp["rows"], "float64")
        out["float64"] = {"logps/chosen": sum(s[0] for s in sums) / len(sums),
                          "logps/rejected": sum(s[1] for s in sums) / len(sums)}
    with open(argv[1], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1:])
