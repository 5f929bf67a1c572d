"""Nightly regression tracking: an append-only history of every nightly's raw values, rules per metric,
change points over the whole history, and a bisection that measures itself.

    store        the SQLite history (results/history/nightly.sqlite): nights, samples, annotations
    fingerprint  the hardware and software key a night is compared within
    metrics      what a run record contributes (tokens/s, step times, memory, losses, speculation, status)
    rules        the verdict per case and metric: rolling baseline, robust spread, persistence, labels
    changes      change points (ruptures) with the commit range each falls in
    bisect       first bad commit between two, measured A/B in throw-away worktrees
    summary      the Markdown summary and the verdict file
    cli          ``superoffload nightly record|check|accept|annotate|import|history|bisect``

docs/nightly.md has the rules, their defaults and the noise measurement behind them.
"""
