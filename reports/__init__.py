"""Report code of the benchmark workflow: load result files, draw deterministic figures, render the
Jinja2 HTML report, and check nightly regressions. Not an installed package: the workflow runs
``python reports/render.py ...`` and ``python reports/nightly.py ...``, which put the repository root on
``sys.path``. Reads only result files, each through its schema where it has one
(superoffload/harness/*.schema.json), never the code that wrote them."""
