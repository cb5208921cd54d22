"""Timing-fault injection into DNN accelerators: fault model, injection, campaigns, metrics, defenses.

Everything this package reports is simulated (labelled ``basis: simulated``).
Heavy imports (torch, h5py, matplotlib) happen inside the modules that need them.
"""
