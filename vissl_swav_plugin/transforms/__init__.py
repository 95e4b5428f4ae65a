"""Data transforms registered with Classy Vision: multi-crop (``multicrop_plugin``) and
per-image standardisation (``per_image_standardize``).
"""
