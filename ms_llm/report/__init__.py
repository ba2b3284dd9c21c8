"""Seeing runs: the self-contained HTML report (`ms-llm report`, `write_report`) and curve comparison against a
baseline or golden curve (`ms-llm compare-curves`; the comparison itself is ms_llm/rundir/curves.py). Reads run
directories only, so it works on runs made elsewhere (it never imports ms_llm.train, nor another tool: the
diagnosis it shows is handed in)."""


def write_report(run_dirs, output=None, align="step", title=None, diagnose=None):
    """See ms_llm.report.report.write_report (imported lazily: Bokeh takes about a second to import)."""
    from ms_llm.report.report import write_report as _write

    return _write(run_dirs, output, align, title, diagnose)


__all__ = ["write_report"]
