"""Which parts of the diagnosis each of ms_llm's logged fields feeds, so that a run read from another framework's
log can say once what it could not be judged on, and why (`ms-llm diagnose` prints these lines)."""

# field -> (what it is, the diagnosis that reads it)
NEEDS = {
    "loss": ("the training loss", "the loss-curve rules (non-finite loss, divergence, spikes, progress)"),
    "grad_norm": ("the gradient norm", "the gradient evidence (exploding gradients, always clipped)"),
    "loss_scale": ("the loss scale", "the loss-scale rule (a scale that collapses or keeps dropping)"),
    "skipped_interval": ("the skipped (overflowed) steps", "the loss-scale rule (frequent overflows)"),
    "tokens_per_s": ("the throughput", "the throughput rules (uneven or falling speed, speed against a benchmark)"),
    "mfu": ("the model FLOPs utilisation", "the low-MFU rule"),
    "mem_gib": ("the device memory", "the memory rules (near the limit, growing)"),
    "data_wait_frac": ("the time waiting for data", "the data-wait rule"),
    "val_loss": ("a validation loss", "the generalisation rules (validation rising, train/validation gap)"),
    "config": ("the run's settings", "the settings rules (each setting against the published configurations), and "
                                     "the numbers of every cause or action that names a setting (they say the log "
                                     "does not state it)"),
}
# checked in this order; the throughput line also needs what the speed is computed from
ORDER = tuple(NEEDS)


def lacking(run, absent):
    """[(field, why the log lacks it)] of the fields no record of `run` carries; `absent` gives the framework's
    reason per field (its log never prints it, or prints it only with an option)."""
    out = []
    for name in ORDER:
        if name == "val_loss":
            has = any(isinstance(r.get("val_loss"), (int, float)) for r in run.evals)
        elif name == "config":
            has = bool(run.config)
        else:
            has = any(isinstance(r.get(name), (int, float)) and not isinstance(r.get(name), bool) for r in run.train)
        if not has:
            out.append((name, absent.get(name, "")))
    return out


def lines(run):
    """One sentence per missing field: the diagnosis that needs it, and why this log does not have it."""
    framework = run.info.get("framework", "the")
    return [(f"{NEEDS[name][1]}: this {framework} log has no {name} ({NEEDS[name][0]})" if name in NEEDS else
             f"the rule {name}") + (f": {why}" if why else "") for name, why in getattr(run, "lacks", None) or []]
