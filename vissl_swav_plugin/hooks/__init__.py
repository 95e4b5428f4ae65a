"""Training hooks: the registry that attaches them to VISSL's hook generator, each loss's
hooks and the monitors that run whatever the loss (progress, collapse, online kNN,
precise BN, colour warm-up).
"""
