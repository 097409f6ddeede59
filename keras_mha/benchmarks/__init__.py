"""`keras-mha bench layers`: attention speed against Keras, keras-hub and the fused kernel.

`layers` runs and renders the benchmark; `backends` holds what differs per backend
(compiling, the hand-written references, the matmul peak and copy bandwidth).
"""
