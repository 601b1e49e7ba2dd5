#!/usr/bin/env bash
# Prepare a GPU machine without network access: wheels carried in .whl/ (e.g. pydantic) and every in-tree
# distribution, editable, offline. From the repository root:  source benchmarks/gpu_setup.sh
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site
# an editable install of another checkout (or of the core's old distribution name) would shadow this one
python3 -m pip uninstall -y -q nanocore nanocore-llm >/dev/null 2>&1
dists=". ./conformance"
for d in plugins*/*/; do [ -f "$d/pyproject.toml" ] && dists="$dists ./$d"; done
python3 -m pip install -q --no-index --no-deps --no-build-isolation $(for d in $dists; do echo -e "-e $d"; done) >/tmp/pip-install.log 2>&1 \
  || { tail -20 /tmp/pip-install.log; return 1; }
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
