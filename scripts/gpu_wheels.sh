#!/usr/bin/env bash
# Fetch, here, the wheels a lent GPU machine lacks for scripts/device_check.sh, into .whl/ (git-ignored; the
# device call carries it: carry [".whl"]). From the repository root, with network:  bash scripts/gpu_wheels.sh
#
# The lent machine (one H100 or H200, x86-64, CPython 3.12 with torch 2.11+cu130) has no package index. Its
# image holds the packages listed in MACHINE below (the device tool's list of 2026-11-17). What the check
# imports that the list lacks, found by importing every module the check runs (the harness, every baseline,
# DeepSpeed, calibrate, bench adam, the report, the workflow's scripts, the CUDA tests) and mapping sys.modules
# to distributions: DeepSpeed and its hjson and pydantic (pydantic-core, annotated-types, typing-inspection),
# and jsonschema (jsonschema-specifications, referencing, rpds-py). typing-extensions travels too: pydantic
# needs a newer one than the image may have, and a newer one serves every older user. Versions are this
# checkout's .venv's (what the tests ran with); DeepSpeed is a source package, built here into a pure wheel with
# DS_BUILD_OPS=0, so its CPU Adam op is JIT-built there (ninja and nvcc are on that machine; device_check.sh
# times it). The script then checks that every requirement of every wheel is on the machine or in .whl, that
# .whl holds one version of each, and that it stays under 48 MiB (64 MiB of tree travels per call).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DEST=${WHEELS:-.whl}
LIMIT_MIB=48
WANT="deepspeed hjson pydantic pydantic-core annotated-types typing-inspection typing-extensions jsonschema
jsonschema-specifications referencing rpds-py"
MACHINE="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite
lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas
nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn
scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash
yarl zipp"

norm() { echo "$1" | tr 'A-Z_.' 'a-z--'; }
version() { $PY -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$1"; }
# a wheel's distribution name as pip saves it: pydantic_core-2.50.5-cp312-...whl -> pydantic-core
wheel_dist() { norm "$(basename "$1" | cut -d- -f1)"; }
mkdir -p "$DEST"
git check-ignore -q "$DEST/x.whl" || { echo "gpu_wheels: $DEST is not git-ignored; add it to .gitignore" >&2; exit 2; }

for dist in $WANT; do
  v=$(version "$dist") || { echo "gpu_wheels: $dist is not installed in $PY's environment" >&2; exit 2; }
  have=""
  for w in "$DEST"/*.whl; do
    [ -e "$w" ] || continue
    [ "$(wheel_dist "$w")" = "$(norm "$dist")" ] || continue
    if [ "$(basename "$w" | cut -d- -f2)" = "$v" ]; then have=$w; else rm -f "$w"; fi  # one version of each
  done
  if [ -n "$have" ]; then echo "have $(basename "$have")"; continue; fi
  if [ "$dist" = deepspeed ]; then
    s=$SECONDS
    DS_BUILD_OPS=0 $PY -m pip wheel -q --no-deps --no-build-isolation --no-cache-dir -w "$DEST" "deepspeed==$v"
    echo "built $(basename "$DEST"/deepspeed-"$v"-*.whl) (DS_BUILD_OPS=0: ops JIT-built on first use) in $((SECONDS - s)) s"
  else
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
      -d "$DEST" "$dist==$v"
    echo "fetched $dist $v"
  fi
done

# Every requirement of every wheel (for CPython 3.12 on x86-64 Linux, extras left out) is on the machine or here
$PY - "$DEST" "$MACHINE" <<'EOF'
import sys, zipfile
from pathlib import Path
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

dest, machine = Path(sys.argv[1]), {canonicalize_name(n) for n in sys.argv[2].split()}
env = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_machine": "x86_64", "implementation_name": "cpython", "extra": ""}
wheels = sorted(dest.glob("*.whl"))
here = {canonicalize_name(w.name.split("-")[0]) for w in wheels}
names = [canonicalize_name(w.name.split("-")[0]) for w in wheels]
dup = sorted({n for n in names if names.count(n) > 1})
missing = []
for w in wheels:
    with zipfile.ZipFile(w) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for line in z.read(meta).decode().splitlines():
            if not line.startswith("Requires-Dist:"):
                continue
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            name = canonicalize_name(req.name)
            if name not in machine and name not in here:
                missing.append(f"{w.name} needs {req}")
if dup or missing:
    sys.exit("gpu_wheels: " + "; ".join([f"several versions of {d}" for d in dup] + missing))
print(f"checked: every requirement of the {len(wheels)} wheels is on the lent machine or in {dest}")
EOF
mib=$(du -sm "$DEST" | cut -f1)
echo "$DEST: $(ls "$DEST"/*.whl | wc -l) wheels, ${mib} MiB (limit $LIMIT_MIB)"
((mib <= LIMIT_MIB)) || { echo "gpu_wheels: $DEST is ${mib} MiB, over $LIMIT_MIB MiB" >&2; exit 1; }
