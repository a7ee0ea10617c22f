"""vLLM's own attention backends as harness backends: driver.py builds vLLM's objects from a Batch
(config, layer, metadata builder, cache write, forward); one module per group of vLLM backends
(cpu_attn.py, flex_attention.py, gpu.py); versions.py holds the supported releases."""
