"""Calibration: measure this machine into a planner `HardwareProfile`, and check the cost model against
measured runs.

The planner (`superoffload.planner`) is "profile in, plan out" and depends on nothing here. This package
sits above both the planner and the harness: it times the harness's models and training systems and
reads its run records.

- `machine`: `superoffload calibrate`, the microbenchmarks that fill a HardwareProfile.
- `compute`: profiled compute of named workloads (`calibrate --workloads`).
- `systems`: each training system's step machinery timed on a degenerate model.
- `accuracy`: `superoffload validate`, predicted vs measured step times of run records.
- `threads`: the compute-thread setting the measurements run at.
"""
