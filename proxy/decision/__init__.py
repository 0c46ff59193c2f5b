"""Pure decision logic: questions, labels, prompt layout, probability readout.

Nothing here performs I/O or imports aiohttp; every function is a plain
computation with exact, unit-tested results.
"""
