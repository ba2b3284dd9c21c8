"""The step's graphs compiled, or loaded from the compile cache and checked (ms_llm/train/compile_cache.py), and its
first step taken: every path that throws graphs away and compiles them afresh is here, and nowhere else.

With the compile cache on:
  key the entry on the built step → compile with the cache on (load on a hit) → cache off → signature and binding
  checks (a mismatch: one warning, the graphs compiled afresh, before anything ran) → the first step → on a fresh
  start, record what it did (fill) or compare it with the record (reuse). A reused entry whose first step differs:
  one warning, the entry discarded, the graphs compiled afresh, the step's parameters set back to their
  initialisation (`Session.initial_state`) and the step retaken on the same inputs. Every rank does the same, or none.
"""
from ms_llm.train import compile_cache
from ms_llm.train.setup.context import all_ranks_ok, release_freed_host_memory


def uses_compile_cache(s, wanted=True):
    """Whether the step of session `s` compiles through the compile cache: `wanted`, on in the config, graph mode,
    and a process MindSpore's cache can run in (else a note says why not)."""
    ctx = s.cfg.context
    if not (wanted and ctx.compile_cache and ctx.mode == "graph"):
        return False
    why_not = compile_cache.unusable_reason()
    if why_not:  # (select_device switched MindSpore's cache off already)
        s.log(f"note: compile cache off: {why_not}")
    return why_not is None


def compile_step(s, probe, first_step, use_cache):
    """Compile the step cells of session `s` for `probe` (their inputs), then take the first step: `first_step()`,
    which runs the compiled cells on the step's inputs. Returns (that step's output, how the graphs came to be:
    "compiled" with the cache off, "filled" compiled into a cache entry, "reused" loaded from one)."""
    cells = s.step_cells
    if not use_cache:
        for cell, x in zip(cells, probe):
            cell.compile(*x)
        release_freed_host_memory()
        return first_step(), "compiled"
    entry = compile_cache.Entry(compile_cache.cache_key(s.cfg, cells, probe, s.rt.world_size, s.purpose), s.rt.rank)
    identity = compile_cache.run_identity(s.cfg, s.manifest)
    with entry.locked():
        s.log(f"compile cache: {'reusing' if entry.hit else 'filling'} {entry.path}")
        entry.compile(cells, probe)
        reused, cacheable = check_graphs(s, entry, cells, probe)
        filled = cacheable and not reused
        if filled:  # the graphs' signatures, for whoever reuses the entry; the first step follows below
            entry.write_record(cells, identity)
    release_freed_host_memory()
    expected = entry.recorded_first_step(identity) if reused and s.fresh_start else None
    before = compile_cache.small_parameter_sums(s.step_fn) if s.fresh_start else None
    out = first_step()
    seen = compile_cache.first_step_record(out, before, compile_cache.small_parameter_sums(s.step_fn)) \
        if before is not None else None
    if not reused:
        if filled and seen is not None:
            entry.write_record(cells, identity, seen)
        return out, "filled" if filled else "compiled"
    diff = compile_cache.first_difference(expected, seen) if expected is not None else None
    if all_ranks_ok(s.rt, diff is None):
        return out, "reused"
    s.log(f"warning: the compile cache entry {entry.path} did not reproduce the first step it was filled with "
          f"({diff}); it was discarded and the step compiled afresh" if diff else
          "warning: another rank's compile cache entry did not reproduce its first step; the step was compiled "
          "afresh")
    entry.discard()
    compile_cache.recompile(cells, probe)
    s.load_state(s.initial_state())
    return first_step(), "compiled"


def check_graphs(s, entry, cells, probe):
    """The signature and binding checks of freshly compiled or loaded graphs; a loaded graph that fails is dropped
    and compiled afresh here, before it runs. Returns (reused: the cells run the entry's graphs, cacheable: the
    entry may be kept)."""
    mismatch = entry.signature_mismatch(cells, probe) if entry.hit else None
    loaded = entry.hit
    if not all_ranks_ok(s.rt, mismatch is None):
        s.log(f"warning: compile cache entry {entry.path} discarded and the step compiled afresh: "
              f"{mismatch or 'another rank found its graphs were not the step'}")
        entry.discard()
        compile_cache.recompile(cells, probe)
        loaded = False
    unowned = {type(c).__name__: compile_cache.unowned_parameters(c) for c in cells}
    unowned = {k: v for k, v in unowned.items() if v}
    if not unowned:
        return loaded, mismatch is None
    names = "; ".join(f"{k} reads {len(v)} parameter(s) it does not own, e.g. {v[0]}" for k, v in unowned.items())
    entry.discard()
    if loaded:
        compile_cache.recompile(cells, probe)
        s.log(f"warning: compile cache entry {entry.path} discarded and the step compiled afresh: {names}")
    else:
        s.log(f"warning: the training step was not cached ({names}); a graph loaded from the cache would read "
              f"private copies of those parameters")
    return False, False
