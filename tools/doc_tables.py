#!/usr/bin/env python
"""Entry point kept for checkouts: writes the documentation's measured tables (README.md,
docs/) between their markers from the records in docs/experiments/ and the code; the code is
``vissl_swav_plugin.tools.doc_tables``.

usage: python tools/doc_tables.py [--check]
"""
import sys

from vissl_swav_plugin.tools.doc_tables import main

if __name__ == "__main__":
    sys.exit(main())
