"""The training loss of a run: one objective and any number of added terms, each a part in its own file.

    scaled, logged, *aux = loss(grad_scale, ids, *columns)            (or (grad_scale, share, ids, *columns): base.py)

    objective   what the run trains the model's output on (one per run):
                  token.py       next-token cross-entropy, over the whole logits or (chunked.py) the head and the
                                 cross-entropy a chunk of tokens at a time; the mean over the tokens, or with the loss
                                 mask of chat data (masked.py) the sum over the tokens it keeps ÷ the step's share of
                                 them (base.py), so that the step's loss is their mean over the whole step
                  preference.py  DPO / IPO / SimPO on chosen/rejected pairs against the reference's log-probs
    terms       what is added to the objective (any number):
                  routed.py      a mixture of experts' router losses (load balancing, z-loss), averaged over the MoE
                                 layers, with the router statistics as an aux output

    scaled = (objective + Σ terms) · grad_scale     logged = objective (comparable with val_loss and dense runs)

Any term goes with any objective: an MoE model fine-tunes on chat data (masked, whole or chunked) and trains on
preference pairs with its router term. The terms are differentiated with the objective under the same
÷ accumulation rule; the chunked objective, which computes its own gradients, returns its scaled loss and the terms
are added to it scaled. `aux` is the objective's aux outputs, then each term's (one per entry of `aux_shapes`, in
that order). In evaluation the objective's outputs alone (the terms train, they are not measured by val_loss).

The host side (`inputs`, `prepare`, `log_fields`, `eval_sums`, `eval_record`) is the objective's when it reads
columns beyond the ids (the loss mask's weights, the preference pairs and their reference, which follow `ids` in the
cell's arguments); on plain text the ids alone and the mean loss, here. The model is read through `forward_layers`
(hidden states, router aux loss, router statistics) when a term needs the router, else through its call (logits) or
`hidden_states` and `head_weight` (the chunked objective), nothing else.
"""
from mindspore import nn

from ms_llm.train.losses.base import Loss, mean_loss_record, mean_loss_sums


class ComposedLoss(Loss):
    """`objective` (a part of token.py, chunked.py or preference.py) plus `terms` (parts such as routed.RouterTerm)."""

    def __init__(self, model, objective, terms=()):
        super().__init__(model)
        self.objective = objective
        self.terms = nn.CellList(list(terms))
        self.routed = any(t.reads_router for t in terms)
        self.sums_tokens, self.has_columns = objective.sums_tokens, objective.has_columns
        self.aux_shapes = tuple(objective.aux_shapes) + tuple(s for t in terms for s in t.aux_shapes)
        self.set_train(True)

    # --- host side: the objective's, or plain text's (the ids alone, the mean loss) ------------------------------

    def inputs(self, batches, count=True):
        if not self.has_columns:
            return [(b,) for b in batches]
        return self.objective.inputs(batches, count, self.training)

    def prepare(self, session, log, resumed=False):
        if self.has_columns:
            self.objective.prepare(self, session, log, resumed)

    def log_fields(self):
        return self.objective.log_fields() if self.has_columns else {}

    def eval_sums(self, outputs):
        return self.objective.eval_sums(outputs) if self.has_columns else mean_loss_sums(outputs)

    def eval_record(self, sums, ranks):
        return self.objective.eval_record(sums, ranks) if self.has_columns else mean_loss_record(sums, ranks)

    # --- the graph ---------------------------------------------------------------------------------------------

    def model_output(self, ids, columns):
        """(what the objective reads: logits, or (final hidden states, head weight); router aux loss; router
        statistics (a tuple of rows; empty without a router term))."""
        x = ids[:, :-1]
        segments = self.objective.segments(columns) if self.has_columns else None  # plain text: one sequence a row
        if self.routed:
            states, router_aux, router_stats = self.model.forward_layers(x, segments)
            if self.objective.reads_hidden:
                return (states[-1], self.model.head_weight()), router_aux, router_stats
            return self.model.logits(states[-1]), router_aux, router_stats
        if self.objective.reads_hidden:
            states = self.model.hidden_states(x) if segments is None else self.model.hidden_states(x, segments)
            return (states[-1], self.model.head_weight()), None, ()
        return (self.model(x) if segments is None else self.model(x, segments)), None, ()

    def construct(self, grad_scale, *inputs):
        # (share, ids, *columns) for an objective summed over tokens, else (ids, *columns)
        share = inputs[0] if self.sums_tokens else None
        ids = inputs[1] if self.sums_tokens else inputs[0]
        columns = inputs[2:] if self.sums_tokens else inputs[1:]
        out, router_aux, router_stats = self.model_output(ids, columns)
        targets = ids[:, 1:]
        if not self.training:
            return self.objective.evaluate(out, targets, columns)
        value, logged, aux = self.objective.train(out, targets, grad_scale, share, columns)
        added = None
        for term in self.terms:
            term_value, term_aux = term.train(router_aux, router_stats)
            added = term_value if added is None else added + term_value
            aux = aux + term_aux
        if self.objective.scales_itself:
            scaled = value if added is None else value + added * grad_scale
        else:
            scaled = (value if added is None else value + added) * grad_scale
        return (scaled, logged) + aux
