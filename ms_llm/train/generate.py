"""Text generation from a finished run: `ms-llm sample --run-dir D --prompt "ROMEO:"`. This module loads the run;
the generation itself (prefill once, then one token per step against a fixed-size KV cache) is ms_llm.generate's.
"""
import numpy as np

from ms_llm.generate import Generator, next_token


def load_run(run_dir, checkpoint=None, with_manifest=False):
    """(config, tokenizer, model with the run's weights) for a run directory (+ the dataset manifest)."""
    from ms_llm.data.manifest import load_manifest
    from ms_llm.data.tokenizers import from_spec
    from ms_llm.train.setup.run_model import load_run_model

    cfg, model, _ = load_run_model(run_dir, checkpoint=checkpoint)
    manifest = load_manifest(cfg.data.dataset_dir, blend=cfg.data.blend)
    out = (cfg, from_spec(manifest["tokenizer"]), model)
    return out + (manifest,) if with_manifest else out


def chat_prompt(manifest, tokenizer, prompt, run_dir):
    """(prompt ids, stop id) for `sample --chat`: the prompt as the user's message, rendered with the chat template
    the run's data was made with and the assistant header after it; generation stops at the template's eos_token."""
    from ms_llm.data.templates import ChatTemplate
    from ms_llm.errors import UserError

    spec = manifest.get("chat_template")
    if not spec:
        raise UserError(f"sample --chat: the dataset of run '{run_dir}' has no chat template (it was not made with "
                        f"`ms-llm preprocess --format chat|instruction`). Sample without --chat, or from a run "
                        f"fine-tuned on chat data.")
    template = ChatTemplate.from_spec(spec)
    text = template.render([{"role": "user", "content": prompt}], add_generation_prompt=True)
    eos = template.special_tokens.get("eos_token")
    stop = tokenizer.token_id(eos) if eos and hasattr(tokenizer, "token_id") else None
    return tokenizer.encode(text), (tokenizer.eod_id if stop is None else stop)


def sample(run_dir, prompt="\n", max_new_tokens=500, temperature=0.8, top_k=200, seed=0, num_samples=1, checkpoint=None,
           chat=False):
    """Generated texts; with `chat`, the assistant's replies to `prompt` (rendered with the run's chat template)."""
    from ms_llm.train.setup.context import setup_context
    from ms_llm.train.setup.run_model import load_run_config

    setup_context(load_run_config(run_dir).context)
    cfg, tokenizer, model, manifest = load_run(run_dir, checkpoint, with_manifest=True)
    stop = None
    if chat:
        prompt_ids, stop = chat_prompt(manifest, tokenizer, prompt, run_dir)
    else:
        prompt_ids = tokenizer.encode(prompt) if prompt else np.array([tokenizer.eod_id], np.int32)
    generator, outs = Generator(model, cfg.model.seq_length), []
    for i in range(num_samples):
        rng = np.random.default_rng(seed + i)
        choose = None if temperature <= 0 else (lambda _, logits: next_token(logits, temperature, top_k, rng))
        new = generator.generate([prompt_ids.tolist()], max_new_tokens, choose,  # None: greedy, in the graph
                                 None if stop is None else (lambda _, tokens: tokens[-1] == stop))
        outs.append(tokenizer.decode(new[0] if chat else prompt_ids.tolist() + new[0]))
    return outs
