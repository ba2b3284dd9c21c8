"""Evaluation through lm-evaluation-harness (the optional `eval` extra): `ms-llm eval` on a run directory, a
checkpoint or a Hugging Face folder, the bundled demo task, and evaluation during training (a hook the entry point
hands to the loop). docs/evaluation.md."""
