"""The diagnosis's rules, one module per kind of symptom; each registers its rules with `@rule` (../registry.py),
declaring what it finds and which findings it reads. Importing this package registers them all; rules that read
nothing run in the order of MODULES (the loss first: most findings read its verdicts), each module's in the order
it defines them."""
import importlib

MODULES = ("loss", "moe", "regularisation", "progress", "finetune", "preference", "generalisation", "tasks", "history",
           "system", "device", "wall_time", "measured", "bisected", "schedule", "remote")
for _name in MODULES:
    importlib.import_module(f"{__name__}.{_name}")
