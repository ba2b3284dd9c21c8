"""lm-evaluation-harness's `LM` backed by an ms_llm model, registered as `ms_llm`.

Requests are tokenized and cut exactly as lm-eval's Hugging Face model (`--model hf`) does, so the same model gives
the same numbers through either (tests/test_eval_parity.py):
- loglikelihood: context + continuation, the last max_length + 1 tokens kept (cut from the left); the continuation's
  tokens scored (TemplateLM does the context/continuation split and the empty-context prefix token);
- loglikelihood_rolling: lm-eval's disjoint rolling windows of max_length tokens after the prefix token;
- generate_until: the context's last max_length - max_gen_toks tokens, greedy (or sampled when do_sample) until a
  stop string or the end-of-text token, the text cut at the first stop string.
Scoring goes through ms_llm.eval.scorer (batches padded to length buckets), generation through ms_llm.generate (the
KV cache). A request longer than the model's context is cut as above and said once.
"""
import json

from ms_llm.errors import UserError

EXTRA = "eval"
HINT = f"pip install \"lm-eval>=0.4,<0.5\"   (or: pip install -e \".[{EXTRA}]\")"


def require_lm_eval():
    """The lm_eval package, or one paragraph naming the extra to install."""
    try:
        import lm_eval  # noqa: F401
        from lm_eval.api.model import TemplateLM  # noqa: F401
    except ImportError as e:
        raise UserError(f"evaluation runs through lm-evaluation-harness, which is not installed ({e}). Install the "
                        f"optional extra: {HINT}") from None
    return lm_eval


require_lm_eval()  # this module subclasses lm-eval's LM: without the package it cannot be imported

from lm_eval import utils as lm_utils  # noqa: E402
from lm_eval.api.model import TemplateLM  # noqa: E402
from lm_eval.api.registry import register_model  # noqa: E402
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text  # noqa: E402
from tqdm import tqdm  # noqa: E402

DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's Hugging Face model's default
LOGITS_BUDGET = 1 << 28  # float32 logits of one scoring batch: 1 GiB
MAX_BATCH = 32


def default_batch_size(loaded):
    """As many rows as keep a full-context batch's logits (rows x context x vocabulary floats) within
    LOGITS_BUDGET, at most MAX_BATCH: 32 for the quickstart, 1 for a 150k vocabulary at 2,048 tokens."""
    return max(1, min(MAX_BATCH, LOGITS_BUDGET // (loaded.context * loaded.model.vocab_size)))


@register_model("ms_llm")
class MsLLM(TemplateLM):
    """An ms_llm model for lm-eval. Built from a loaded model (`ms_llm.eval.source.LoadedModel`), or by lm-eval from
    model_args: `run_dir=R[,checkpoint=F]`, `hf=DIR` or `checkpoint=F[,config=C],tokenizer=T`, with batch_size and
    max_length."""

    def __init__(self, loaded=None, batch_size=None, log=print, progress=True, seed=1234, device=None,
                 max_batch_size=None, **source):
        super().__init__()  # device, max_batch_size: what lm-eval hands every model; MindSpore's context decides
        if loaded is None:
            from ms_llm.eval.source import load_model

            loaded = load_model(**source, log=log)
        batch_size = default_batch_size(loaded) if batch_size in (None, "auto") else int(batch_size)
        if batch_size < 1:
            raise UserError(f"--batch-size = {batch_size} must be at least 1.")
        self.loaded, self.tok, self.log = loaded, loaded.tokenizer, log
        self._batch_size, self.progress, self.seed = batch_size, progress, int(seed)
        from ms_llm.generate.generator import length_buckets
        from ms_llm.eval.scorer import Scorer

        self.buckets = length_buckets(loaded.context)
        self.scorer = Scorer(loaded.model, self.buckets, batch_size)
        self.generator = None  # built at the first generate_until request
        self.truncated = 0  # requests cut to the context

    # --- what TemplateLM asks of a model ----------------------------------------------------------------
    @property
    def eot_token_id(self):
        return self.tok.eot_id

    @property
    def prefix_token_id(self):
        return self.tok.prefix_id

    @property
    def max_length(self):
        return self.loaded.context

    @property
    def max_gen_toks(self):
        return DEFAULT_MAX_GEN_TOKS

    @property
    def batch_size(self):
        return self._batch_size

    @property
    def tokenizer_name(self):
        return self.tok.source.replace("/", "__")

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        return self.tok.encode(string, add_special_tokens)

    def tok_decode(self, tokens):
        return self.tok.decode(tokens)

    def cut(self, n, why):
        """Note a request that does not fit the context: said once, counted always."""
        if self.truncated == 0:
            self.log(f"note: a request of {n} tokens is longer than the model's context ({self.max_length} tokens, "
                     f"{why}); such requests are cut from the left to fit, as lm-eval's Hugging Face model does "
                     f"(said once; the count is printed at the end)")
        self.truncated += 1

    def bar(self, total, what):
        return tqdm(total=total, desc=what, disable=not self.progress or total == 0, leave=False)

    # --- scoring ----------------------------------------------------------------------------------------
    def loglikelihood(self, requests, disable_tqdm=False):
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm or not self.progress)

    def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
        rows = []
        for _, context_enc, continuation_enc in requests:
            whole = context_enc + continuation_enc
            if len(whole) > self.max_length + 1:
                self.cut(len(whole) - 1, "context and continuation")
            rows.append((whole[-(self.max_length + 1):], min(len(continuation_enc), self.max_length)))
        with self.bar(len(rows), "loglikelihood") as bar:
            answers = self.scorer.score(rows, bar.update)
        for (key, _, _), answer in zip(requests, answers):
            if key is not None:  # a rolling window's key is None: its document is cached whole
                self.cache_hook.add_partial("loglikelihood", key, answer)
        return answers

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        windows, counts = [], []
        for (string,) in [r.args for r in requests]:
            doc = [(None,) + w for w in map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
                context_len=1))]
            windows += doc
            counts.append(len(doc))
        scores = self._loglikelihood_tokens(windows)
        out, at = [], 0
        for request, n in zip(requests, counts):
            total = sum(s for s, _ in scores[at:at + n])
            at += n
            out.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return out

    # --- generation -------------------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm=False):
        import numpy as np

        from ms_llm.generate import Generator, next_token

        if self.generator is None:
            self.generator = Generator(self.loaded.model, self.max_length, self.batch_size, self.buckets)
        eos = self.tok.decode_all([self.eot_token_id])
        groups = {}  # requests with the same generation settings run batched together
        for i, request in enumerate(requests):
            context, gen_kwargs = request.args
            groups.setdefault(json.dumps(gen_kwargs, sort_keys=True, default=str), []).append(i)
        out = [None] * len(requests)
        rng = np.random.default_rng(self.seed)
        with self.bar(len(requests), "generate_until") as bar:
            for members in groups.values():
                kwargs = normalize_gen_kwargs(requests[members[0]].args[1], self.max_gen_toks)
                until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
                max_gen_toks = kwargs.pop("max_gen_toks")
                sampled = bool(kwargs.get("do_sample")) and float(kwargs.get("temperature") or 0) > 0
                temperature = float(kwargs.get("temperature") or 0) if sampled else 0.0
                top_k = kwargs.get("top_k")
                room = self.max_length - max_gen_toks
                if room <= 0:
                    raise UserError(f"a task asks for up to {max_gen_toks} generated tokens (generation_kwargs "
                                    f"max_gen_toks), which leaves no room for its prompt in the model's context of "
                                    f"{self.max_length} tokens. Lower max_gen_toks in the task's YAML, or evaluate "
                                    f"with a longer --max-length.")
                for start in range(0, len(members), self.batch_size):
                    chunk = members[start:start + self.batch_size]
                    prompts = []
                    for i in chunk:
                        ids = self.tok_encode(requests[i].args[0])
                        if len(ids) > room:
                            self.cut(len(ids) + max_gen_toks, f"{max_gen_toks} of them for generation")
                        prompts.append(ids[-room:] or [self.prefix_token_id])

                    def stop(row, tokens):
                        return tokens[-1] == self.eot_token_id or any(u and u in self.tok.decode(tokens) for u in until)

                    choose = None if temperature <= 0 else \
                        (lambda _, logits: next_token(logits, temperature, top_k, rng))  # None: greedy in the graph
                    new = self.generator.generate(prompts, max_gen_toks, choose, stop)
                    for i, tokens in zip(chunk, new):
                        text = postprocess_generated_text(self.tok.decode(tokens), until, None)
                        out[i] = text
                        self.cache_hook.add_partial("generate_until", requests[i].args, text)
                    bar.update(len(chunk))
        return out
