"""Runs a session's optimizer steps; every driver (the trainer, the benchmark, lr-find, overfit) steps through one of
these. The first step compiles the step's graphs, or loads them from the compile cache and checks them, in
ms_llm/train/compile_step.py (which owns every recompile); after it, a step is only its compiled calls:

    step():  batches → the cells' inputs → TrainStep(batch) → StepOutput
             with accumulation: AccumulateStep × accum → TrainStep() (the update) → StepOutput
"""
import time

from ms_llm.train.compile_step import compile_step, uses_compile_cache
from ms_llm.train.setup.context import release_freed_host_memory
from ms_llm.train.session import StepOutput


class StepRunner:
    def __init__(self, session, use_compile_cache=True):
        self.s = session
        self.compiled = False
        self.compile_s = None  # seconds the first step took: compiling or loading its graphs, checks, the step
        self.graphs = None  # how: "compiled" (cache off), "filled" (compiled into a cache entry) or "reused"
        self.use_cache = uses_compile_cache(session, use_compile_cache)

    def step(self, batches=None):
        """One optimizer step on the next micro-batches (or on `batches`)."""
        s = self.s
        t0 = time.perf_counter()
        inputs = s.loss.inputs(batches or s.next_batches())  # the step cells' arguments, per micro-batch
        if self.compiled:
            return self.run(inputs)
        out, self.graphs = compile_step(s, self.graph_inputs(inputs), lambda: self.run(inputs), self.use_cache)
        self.compiled, self.compile_s = True, time.perf_counter() - t0
        return out

    def run(self, inputs):
        step_fn = self.s.step_fn
        if self.s.accum == 1:
            return StepOutput(*step_fn(*inputs[0]))
        for x in inputs:
            step_fn.accumulate(*x)
        return StepOutput(*step_fn())

    def graph_inputs(self, inputs):
        """One step's inputs as the compiled cells take them: TrainStep the batch's; with accumulation,
        AccumulateStep a micro-batch's and TrainStep (the update from the buffers) none."""
        return [inputs[0], ()] if self.s.accum > 1 else inputs[:1]

    def compile(self, batches):
        """Compile the step's graphs for these micro-batches without running them, cache off (`ms-llm benchmark
        --memory` measures the compile apart); the next step takes them as usual."""
        s = self.s
        for cell, x in zip(s.step_cells, self.graph_inputs(s.loss.inputs(batches, count=False))):
            cell.compile(*x)
        self.compiled, self.graphs = True, "compiled"
        release_freed_host_memory()
