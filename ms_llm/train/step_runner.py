"""Runs a session's optimizer steps. The first one compiles the step's graphs, or loads them from the compile cache
and checks them (ms_llm/train/compile_cache.py); every driver (the trainer, the benchmark, lr-find, overfit) steps
through one of these, so every driver gets the checks and the recovery.

    step():  batches → the cells' inputs → [AccumulateStep × (accum - 1)] → TrainStep → StepOutput

On the first step with the compile cache on:
  key the entry on the built step → compile with the cache on (load on a hit) → cache off → signature and binding
  checks (a mismatch: one warning, the graphs compiled afresh, before anything ran) → the step → on a fresh start,
  record what it did (fill) or compare it with the record (hit). A reused entry whose first step differs: one
  warning, the entry discarded, the graphs compiled afresh, the step's parameters set back to their initialisation
  (`Session.initial_state`) and the step retaken on the same batches. Every rank does the same, or none.
"""
from ms_llm.train import compile_cache
from ms_llm.train.setup.context import all_ranks_ok, release_freed_host_memory
from ms_llm.train.session import StepOutput


class StepRunner:
    def __init__(self, session, use_compile_cache=True):
        self.s = session
        self.compiled = False
        cfg = session.cfg
        self.use_cache = use_compile_cache and cfg.context.compile_cache and cfg.context.mode == "graph"
        if self.use_cache:
            why_not = compile_cache.unusable_reason()
            if why_not:  # (select_device switched MindSpore's cache off already)
                session.log(f"note: compile cache off: {why_not}")
                self.use_cache = False
        self.entry = None  # the compile cache entry of this step, once keyed

    def step(self, batches=None):
        """One optimizer step on the next micro-batches (or on `batches`)."""
        s = self.s
        inputs = s.step_inputs(batches or s.next_batches())
        if not self.compiled:
            return self.first_step(inputs)
        return self.run(inputs)

    def run(self, inputs):
        step_fn = self.s.step_fn
        for x in inputs[:-1]:
            step_fn.accumulate(*x)
        return StepOutput(*step_fn(*inputs[-1]))

    def graph_inputs(self, inputs):
        """One step's inputs as the compiled cells take them: AccumulateStep the first micro-batch's, TrainStep the
        last's."""
        return inputs[-2:] if self.s.accum > 1 else inputs[-1:]

    def compile(self, batches):
        """Compile the step's graphs for these micro-batches without running them, cache off (`ms-llm benchmark
        --memory` measures the compile apart); the next step takes them as usual."""
        s = self.s
        for cell, x in zip(s.step_cells, self.graph_inputs(s.step_inputs(batches, count=False))):
            cell.compile(*x)
        self.compiled = True
        release_freed_host_memory()

    def first_step(self, inputs):
        s = self.s
        cells, probe = s.step_cells, self.graph_inputs(inputs)
        if not self.use_cache:
            for cell, x in zip(cells, probe):
                cell.compile(*x)
            self.compiled = True
            release_freed_host_memory()
            return self.run(inputs)
        entry = self.entry = compile_cache.Entry(
            compile_cache.cache_key(s.cfg, cells, probe, s.rt.world_size, s.purpose), s.rt.rank)
        identity = compile_cache.run_identity(s.cfg, s.manifest)
        with entry.locked():
            s.log(f"compile cache: {'reusing' if entry.hit else 'filling'} {entry.path}")
            entry.compile(cells, probe)
            cacheable = self.check_graphs(entry, cells, probe)
            filled = cacheable and not entry.hit
            if filled:  # the graphs' signatures, for whoever reuses the entry; the first step follows below
                entry.write_record(cells, identity)
        self.compiled = True
        release_freed_host_memory()
        expected = entry.recorded_first_step(identity) if entry.hit and cacheable and s.fresh_start else None
        before = compile_cache.small_parameter_sums(s.step_fn) if s.fresh_start else None
        out = self.run(inputs)
        seen = compile_cache.first_step_record(out, before, compile_cache.small_parameter_sums(s.step_fn)) \
            if before is not None else None
        if not entry.hit:
            if filled and seen is not None:
                entry.write_record(cells, identity, seen)
            return out
        diff = compile_cache.first_difference(expected, seen) if expected is not None else None
        if all_ranks_ok(s.rt, diff is None):
            return out
        s.log(f"warning: the compile cache entry {entry.path} did not reproduce the first step it was filled with "
              f"({diff}); it was discarded and the step compiled afresh" if diff else
              "warning: another rank's compile cache entry did not reproduce its first step; the step was compiled "
              "afresh")
        entry.discard()
        compile_cache.recompile(cells, probe)
        s.load_state(s.initial_state())
        return self.run(inputs)

    def check_graphs(self, entry, cells, probe):
        """The signature and binding checks of freshly compiled or loaded graphs. Returns whether the entry may be
        kept; a loaded graph that fails is dropped and compiled afresh here, before it runs."""
        s = self.s
        mismatch = entry.signature_mismatch(cells, probe) if entry.hit else None
        if not all_ranks_ok(s.rt, mismatch is None):
            s.log(f"warning: compile cache entry {entry.path} discarded and the step compiled afresh: "
                  f"{mismatch or 'another rank found its graphs were not the step'}")
            entry.discard()
            compile_cache.recompile(cells, probe)
            entry.hit = False
        unowned = {type(c).__name__: compile_cache.unowned_parameters(c) for c in cells}
        unowned = {k: v for k, v in unowned.items() if v}
        if not unowned:
            return mismatch is None
        names = "; ".join(f"{k} reads {len(v)} parameter(s) it does not own, e.g. {v[0]}" for k, v in unowned.items())
        entry.discard()
        if entry.hit:
            compile_cache.recompile(cells, probe)
            s.log(f"warning: compile cache entry {entry.path} discarded and the step compiled afresh: {names}")
        else:
            s.log(f"warning: the training step was not cached ({names}); a graph loaded from the cache would read "
                  f"private copies of those parameters")
        entry.hit = False
        return False
