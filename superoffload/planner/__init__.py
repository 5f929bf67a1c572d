"""Hardware profiles, the iteration cost model and the planner: profile in, plan out.

Depends only on ``superoffload.shapes``, ``superoffload.options`` and ``superoffload.packing`` (never on
the engine, the harness, the calibrate package or DeepSpeed; tests/planner/test_layering.py checks every
import, including those inside functions). Entry points: ``presets.get_profile``, ``costmodel.predict``,
``plan.make_plan``, ``explain.explain``, ``paper.paper_comparison``. Measuring a profile is
``superoffload.calibrate``. See docs/cost_model.md.
"""
