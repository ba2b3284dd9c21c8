"""The search strategies, as plain logic over `run_points(list of value dicts) -> list of trial records`:

- grid: every combination of the varied values.
- one-at-a-time (the coordinate method of docs/tuning.md): from the golden config, vary the first key with
  the others at their golden values, fix its best value, move to the next key; after the last key, go round
  again from the first with the values found, until a round changes nothing or `rounds` is reached. The point
  being improved on (the incumbent) is always one of the candidates, so a key's golden value competes even when
  it is not in the --vary list, and a value moves only on a strict improvement.
"""
import itertools

from ms_llm.tune.values import show


def grid(spec, run_points, echo):
    keys = list(spec.vary)
    points = [dict(zip(keys, combo)) for combo in itertools.product(*(spec.vary[k] for k in keys))]
    echo(f"grid: {len(points)} trial(s) over {', '.join(keys)}")
    records = run_points(points)
    return best_of(records), []


def one_at_a_time(spec, run_points, echo):
    incumbent, best, order = dict(spec.golden), None, []
    echo("one-at-a-time from the golden config: " + ", ".join(f"{k}={show(v)}" for k, v in incumbent.items()))
    for rnd in range(1, spec.rounds + 1):
        start = dict(incumbent)
        for key, values in spec.vary.items():
            candidates = list(values) + ([incumbent[key]] if incumbent[key] not in values else [])
            points = [{**incumbent, key: v} for v in candidates]
            others = ", ".join(f"{k}={show(v)}" for k, v in incumbent.items() if k != key) or "no other key"
            echo(f"round {rnd}, {key} (with {others}): {', '.join(show(v) for v in candidates)}")
            records = run_points(points)
            scored = [(r["metric"], 0 if p == incumbent else 1, i) for i, (p, r) in enumerate(zip(points, records))
                      if r["metric"] is not None]
            if scored:
                incumbent = points[min(scored)[2]]
                best = records[min(scored)[2]]
            step = {"round": rnd, "key": key, "fixed": {k: v for k, v in incumbent.items() if k != key},
                    "tried": [{"value": v, "metric": r["metric"], "diverged": r["diverged"], "trial": r["name"]}
                              for v, r in zip(candidates, records)],
                    "best": incumbent[key], "metric": best["metric"] if best else None}
            order.append(step)
            echo(f"round {rnd}, {key}: best {show(incumbent[key])}"
                 + (f" ({spec.metric} {best['metric']:.4f})" if best else " (no trial finished with a value)"))
        if len(spec.vary) == 1:
            break  # another pass over a single key would revisit the same trials
        if incumbent == start:
            echo(f"round {rnd} changed nothing: done")
            break
    return best, order


def best_of(records):
    scored = [r for r in records if r["metric"] is not None]
    return min(scored, key=lambda r: r["metric"]) if scored else None


STRATEGIES = {"grid": grid, "one-at-a-time": one_at_a_time}
