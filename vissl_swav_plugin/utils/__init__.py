"""The bottom layer: numerical and process-group code that imports neither ``vissl`` nor
``classy_vision`` (Sinkhorn-Knopp, k-means, the memory bank's storage, kNN, precision, the
non-finite guard).
"""
