#!/usr/bin/env bash
# Prepare, on this machine, what the GPU machine lacks for benchmarks/gpu_check.py (docs/gpu.md,
# "Measuring on a GPU"): nothing can be downloaded there, and the folder beside the clone does not travel.
#
#   benchmarks/gpu_prepare.sh
#
# 1. .whl/: Python 3.12 x86-64 manylinux wheels of tfbuilder's runtime dependencies that the GPU image
#    does not hold (/work/.library/device/KINDS.md lists what it holds: torch, lightning, pyyaml, einops,
#    tokenizers, sacrebleu, numpy, matplotlib, rich are there; pydantic is not), and typing-extensions,
#    which pydantic wants newer than an image may hold (pure Python: it shadows the image's own harmlessly).
#    The versions are those installed in the Python that runs this script (the ones the tests ran with),
#    else the pins below.
# 2. .gpu-data/multi30k/: a copy of Multi30k from $MULTI30K_DIR, else ../shared/data/multi30k.
#
# Both folders are git-ignored (.gitignore) and travel only when the device call names them in `carry`.
# Set PYTHON to choose the interpreter (default: python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# name and fallback version; pydantic-core must be the version this pydantic names.
PACKAGES="pydantic=2.14.4 pydantic-core=2.50.5 annotated-types=0.8.0 typing-inspection=0.4.5 typing-extensions=4.16.0"

pins=$("$PY" - "$PACKAGES" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version

wanted = [item.split("=") for item in sys.argv[1].split()]
try:
    local = {name: version(name) for name, _ in wanted}
    print(" ".join(f"{name}=={v}" for name, v in local.items()))
except PackageNotFoundError:  # not all installed here: the fallback pins, together
    print(" ".join(f"{name}=={v}" for name, v in wanted))
EOF
)

rm -rf .whl
mkdir -p .whl
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl $pins
echo "wheels: $pins"

src=${MULTI30K_DIR:-../shared/data/multi30k}
if [ -f "$src/test_2016_flickr.de.gz" ]; then
    rm -rf .gpu-data/multi30k
    mkdir -p .gpu-data/multi30k
    cp "$src"/*.gz .gpu-data/multi30k/
    [ -f "$src/README.md" ] && cp "$src/README.md" .gpu-data/multi30k/
    echo "data: $src -> .gpu-data/multi30k"
else
    echo "data: no Multi30k at $src (set MULTI30K_DIR); the parts that need it will be skipped" >&2
fi

for d in .whl .gpu-data; do git check-ignore -q "$d" || { echo ".whl/ or .gpu-data/ is not git-ignored: add them to .gitignore" >&2; exit 1; }; done
du -sh .whl .gpu-data 2>/dev/null || true
total=$(du -sk .whl .gpu-data 2>/dev/null | awk '{s += $1} END {print s}')
echo "carried: ${total} KiB of the 64 MiB a device call may carry"
[ "$total" -lt 32768 ] || { echo "more than 32 MiB to carry: too much" >&2; exit 1; }
