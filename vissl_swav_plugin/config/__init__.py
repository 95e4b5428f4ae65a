"""Config inference and validation, the Hydra search path and dataset statistics
(everything a config needs before any component is built).
"""
