"""Hardware profiles, the iteration cost model and the planner (engine side: never imports the harness).

Entry points: ``presets.get_profile``, ``calibrate.calibrate``, ``costmodel.predict``,
``plan.make_plan``, ``explain.explain``, ``paper.paper_comparison``. See docs/cost_model.md.
"""
