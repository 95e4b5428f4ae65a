"""Model parts registered with VISSL: the projection heads with prototypes and the small
CPU-scale ResNet trunks.
"""
