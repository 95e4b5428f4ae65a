"""The registered losses (``swav_plugin_loss``, ``deepclusterv2_plugin_loss``,
``selav2_plugin_loss``), their config tables and the memory-bank loss base.
"""
