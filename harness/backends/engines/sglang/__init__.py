"""sglang's own attention backends, driven through its real pools, ForwardBatch and RadixAttention.

One module per sglang backend (torch_native, flex on the CPU; flashinfer, fa3 on a GPU); what they
share (the engine, the import, the translation of a Batch into sglang's objects) is engine.py; the
CUDA adapters' stand-ins are gpu.py, their speculative inputs spec.py, their CUDA-graph path graph.py.
"""
