"""The hardware layer of the worker: profiles per SKU, GPU detection through NVML, and the vLLM
arguments that suit a model on the GPUs found. No Django: the worker's virtualenv imports it."""
