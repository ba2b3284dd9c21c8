"""A setting of the run's config that may explain a symptom (`ms-llm diagnose`): what the config says, against
which reference, the effect it would have, and how to tell whether it had that effect in this run.

Effects, and the findings that show each on the curve:

    slow      smaller or fewer useful updates   slow_progress, loss_not_falling, loss_plateau, underfitting
    unstable  larger or noisier updates         divergence, loss_nonfinite, loss_spikes, stats_exploding
    gap       validation apart from training    distribution_shift, generalisation_gap, labels
    start     a start far from ln V             bad_start
    cost      compute or data spent for nothing (no curve finding: the suspect's own measure shows it)

A suspect may also carry its own evidence (`shown_by`: a line from the run, or None), for an effect no other rule
names (a validation loss that has not left the context-free level, a start at ln of a vocabulary the data never
uses). A suspect whose effect shows is a finding and the first cause of the findings it explains; otherwise it is
a note that says the setting did nothing visible.
"""
from dataclasses import dataclass, field
from typing import Callable, Optional, Tuple

SLOW, UNSTABLE, GAP, START, COST = "slow", "unstable", "gap", "start", "cost"
SHOWN_BY = {
    SLOW: ("bisected", "slow_progress", "loss_not_falling", "loss_plateau", "underfitting", "behind_siblings"),
    UNSTABLE: ("bisected", "divergence", "loss_nonfinite", "loss_spikes", "stats_exploding"),
    GAP: ("bisected", "distribution_shift", "generalisation_gap", "labels"),
    START: ("bad_start",),
    COST: ("throughput_left", "bisected", "low_mfu"),
}
SHOWN_IDS = tuple(dict.fromkeys(i for ids in SHOWN_BY.values() for i in ids)) + ("resume_change*",)  # rule_schedule reads
# measured findings (a bisect, a timed setting) show a suspect only when what they measured is the suspect's key
MEASURED = ("throughput_left", "bisected")


@dataclass
class Suspect:
    id: str
    effect: str          # SLOW, UNSTABLE, GAP, START or COST
    setting: str         # what the config says, with the numbers and the reference it is judged against
    cause: str           # the cause sentence used in a symptom finding
    action: str
    strong: bool         # the numbers make the effect large (high confidence when the curve shows it)
    key: str = ""        # the config key ("model.dropout"): a finding whose first cause names it is not repeated
    reference: str = ""  # where the reference comes from (recipes, the dataset's manifest, a paper)
    also: Tuple[str, ...] = ()                   # further effects (dropout: slow and gap)
    shown_by: Optional[Callable] = None          # (run) -> an evidence line when the run shows the effect, or None
    experiment: list = field(default_factory=list)  # the run that separates it from the other suspects
    sets: Tuple[str, ...] = ()                      # the fix as --set overrides ("model.num_heads=2"), when known

    @property
    def effects(self):
        return (self.effect,) + tuple(self.also)


def shown(s, found):
    """The findings that show this suspect's effects on the curve (most severe first)."""
    ids = [i for e in s.effects for i in SHOWN_BY[e]]
    out = [found[i] for i in dict.fromkeys(ids) if i in found and found[i].severity != "info"
           and (i not in MEASURED or (s.key and any(f"--set {s.key}=" in a for a in found[i].actions)))]
    # a resume that changed this key, with an effect on the curve (rules/history.py): the setting shows there
    return out + [f for i, f in found.items() if i.startswith("resume_change") and f.severity != "info" and s.key
                  and f" {s.key} " in f" {f.symptom} "]
