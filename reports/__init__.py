"""Report code of the benchmark workflow: load result files, draw deterministic figures, render the
Jinja2 HTML report and the nightly history's page. Not an installed package: the workflow runs
``python reports/render.py ...``, which puts the repository root on ``sys.path``. Reads only result
files (each through its schema where it has one: superoffload/harness/*.schema.json) and the nightly
history (through superoffload.nightly), never the code that wrote them."""
