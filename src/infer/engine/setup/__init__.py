"""Building the engine's rank before it serves: the model, the KV cache's memory, the
warm-up and rehearsal of its kernels and graphs, and the tensor-parallel workers."""
