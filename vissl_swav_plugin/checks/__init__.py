"""Run-wide config checks: the ones that need the whole run (head against trunk, dataset size
against batch and processes, settings that never act).
"""
