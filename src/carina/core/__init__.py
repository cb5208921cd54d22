"""carina's bottom floor: errors, configs, flags, registries, bench records, doctor.

Nothing here imports torch; every other floor may import from here.
"""
